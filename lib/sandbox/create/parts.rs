//! What `create` makes before the clone, in order: the port leases, the
//! mailbox (its disk, registry record and owner), the egress network with
//! its proxy and the agent's model proxy, the workspace, and the container,
//! attached to its services and started.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::super::{Port, Record, Sandboxes, Settings, container_spec, disk};
use super::Clock;
use super::checks::Checked;
use base::error::{Error, Exit, Result};
use engine::{ContainerSpec, NetworkEngine, Refusal};
use mailbox::door_record::DoorRecord;
use mailbox::registry::{self, Registry};
use wall::egress;
use wall::{LABEL_ROOT, LABEL_ROOT_PATH, LABEL_SANDBOX};

impl<'a> Sandboxes<'a> {
    /// Everything but the clone, up to the started container (made, or
    /// claimed from the warm pool); returns its spec.
    pub(super) fn make_parts(
        &self,
        rec: &mut Record,
        c: &Checked,
        bins: &[(PathBuf, &str)],
        clock: &mut Clock,
    ) -> Result<ContainerSpec> {
        let boxdir = self.make_mailbox(rec, c)?;
        clock.mark("record");
        // A ready pod from the root's warm pool, when it keeps one: the
        // record names it before the egress is keyed by its name.
        let pool = self.pool_plan(rec, &c.settings, bins);
        let mut pooled = false;
        if let Some(p) = &pool {
            pooled = self.pool_take(rec, p, &super::super::spec::labels(self, rec))?;
            clock.mark(if pooled { "pool-claim" } else { "pool-empty" });
        }
        let plan = self.make_egress(rec, c, clock)?;
        if crate::sandbox::scratch::needed(rec.runtime_name()) {
            crate::sandbox::scratch::make(&self.root, &rec.name, &c.settings.tmp_size)?;
        }
        let work = disk::work(&self.root, &rec.name);
        match c.settings.limits.disk {
            _ if c.on_volumes => {}
            Some(bytes) => work.make(bytes, c.settings.uid, 0o755)?,
            None => work.plain(c.settings.uid)?,
        }
        let mut spec = container_spec(self, rec, &c.settings, &boxdir, bins, !c.secrets.is_empty());
        if let Some(p) = &plan {
            use_proxy_address(&mut spec.env, p);
        }
        if let (true, Some(p)) = (pooled, &pool) {
            self.pool_adopt(rec, p, &mut spec)?;
            clock.mark("pool-adopt");
            return Ok(spec);
        }
        if c.on_volumes {
            self.volume_prepare(rec, &mut spec, bins)?;
            clock.mark("volumes");
        }
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
            if let Some(Refusal::PortTaken(_)) = Refusal::of(&e) {
                let hint = if c.on_volumes {
                    let ports: Vec<String> = rec.ports.iter().map(|p| p.host.to_string()).collect();
                    format!(
                        "; the engine at {} refused to publish port {} on its host, where something else holds it: free it there, or try again",
                        self.engine.address(),
                        ports.join(", ")
                    )
                } else {
                    "; a leased port was taken by something else: try again".to_string()
                };
                return Error::new(Exit::TempFail, format!("{e}{hint}"));
            }
            e
        })?;
        clock.mark("start");
        Ok(spec)
    }

    /// Port leases (into the record), the mail disk, the registry record and
    /// the mailbox, given to the sandbox's user; returns the mailbox.
    fn make_mailbox(&self, rec: &mut Record, c: &Checked) -> Result<PathBuf> {
        let name = rec.name.clone();
        let settings: &Settings = &c.settings;
        let (hosts, ip) = if c.on_volumes {
            crate::sandbox::volume::lease_ports(self, settings.ports, &name, &c.ports)?
        } else {
            (self.leases().lease(settings.ports, &name, &c.ports)?, None)
        };
        rec.ports = c
            .ports
            .iter()
            .zip(&hosts)
            .map(|(w, h)| Port {
                container: w.clone(),
                host: *h,
                ip: ip.clone(),
            })
            .collect();
        if !rec.ports.is_empty() {
            self.write_record(rec)?;
        }
        // The mail dir on its own filesystem (lib/sandbox/disk.rs),
        // mounted before the registry makes its boxes on it.
        if let Some(bytes) = settings.limits.mail_disk.filter(|_| !c.on_volumes) {
            disk::mail(&self.root, &name).make(bytes, 0, 0o711)?;
        }
        let reg = Registry::new(&self.root);
        // The keyed digests of the values it is given (and of its project's
        // door.secrets this command has), then the names of its secrets and
        // its project's, go into the root before any value goes into the
        // sandbox: the door resolves them from there whatever its working
        // directory, and refuses a value that is not this one
        // (crates/mailbox/src/redact/names.rs, crates/mailbox/src/door_record.rs); the
        // project's door budgets too.
        let door = DoorRecord::new(&self.root);
        door.record_secrets(&name, &given_values(&c.secrets, &settings.door_secrets))?;
        if let Some((b, file)) = &settings.door_budgets {
            door.record_budgets(b, file)?;
        }
        let mut sb = registry::Sandbox::new(&name, Some(rec.branch.clone()), rec.scope.clone());
        sb.secrets = rec.secrets.clone();
        sb.door_secrets = settings.door_secrets.clone();
        sb.allowed_secrets = settings.allowed_secrets.clone();
        reg.register(&sb)?;
        let boxdir = self.root.sandbox(&name).dir;
        if !c.on_volumes {
            super::super::mailbox::give(&boxdir, settings.uid)?;
        }
        Ok(boxdir)
    }

    /// The egress network and proxy, and beside it the agent's model proxy.
    fn make_egress(
        &self,
        rec: &Record,
        c: &Checked,
        clock: &mut Clock,
    ) -> Result<Option<egress::NetworkPlan>> {
        let Some((eg, allow)) = &c.egress else {
            return Ok(None);
        };
        let nets: &dyn NetworkEngine = self.engine;
        let mut o = egress::Options::from(eg);
        o.labels.insert(LABEL_ROOT.into(), self.id.clone());
        // The proxy's image is the builder's; on a cluster the nodes must
        // have it (as the sandbox's).
        let image = egress::ensure_proxy_image(self.images, &o.proxy_from, &mut |_| {})?;
        let plan = egress::prepare_with_image(nets, &rec.container, allow, &image, &o)?;
        clock.mark("egress");
        if let Some(a) = &c.agent {
            let labels = BTreeMap::from([
                (LABEL_SANDBOX.to_string(), rec.name.clone()),
                (LABEL_ROOT.to_string(), self.id.clone()),
                (
                    LABEL_ROOT_PATH.to_string(),
                    self.root.dir.to_string_lossy().into_owned(),
                ),
            ]);
            a.start_proxy(
                nets,
                self.images,
                &rec.name,
                &rec.container,
                eg,
                &self.root,
                &labels,
            )?;
            clock.mark("model-proxy");
        }
        Ok(Some(plan))
    }
}

/// The (name, value) pairs whose digests the root records for a sandbox:
/// the secrets it is given, and those of `door` (its project's
/// `door.secrets`) set in this command's environment.
fn given_values(given: &[wall::secrets::Secret], door: &[String]) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = given
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    for n in door {
        if out.iter().any(|(m, _)| m == n) {
            continue;
        }
        if let Some(v) = std::env::var_os(n).filter(|v| !v.is_empty()) {
            out.push((n.clone(), v.into_encoded_bytes()));
        }
    }
    out
}

/// Points the proxy variables of `env` at the address `plan` gives: the
/// Docker alias by default, a Service's cluster address on Kubernetes.
/// `NO_PROXY` is left as the spec made it (it may name services).
fn use_proxy_address(env: &mut [String], plan: &egress::NetworkPlan) {
    for e in env.iter_mut() {
        let key = e.split('=').next().unwrap_or_default();
        let proxied = ["http_proxy", "https_proxy"].contains(&key.to_ascii_lowercase().as_str());
        if let Some(v) = plan
            .env
            .iter()
            .find(|p| proxied && p.split('=').next() == Some(key))
        {
            e.clone_from(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_variables_take_the_plans_address_and_keep_no_proxy() {
        let plan = egress::NetworkPlan {
            network: "n".into(),
            proxy: "p".into(),
            env: egress::proxy_env_at("10.96.0.7"),
            sysctls: BTreeMap::new(),
            allow: egress::AllowList::none(),
        };
        let mut env = egress::proxy_env();
        env.push("NO_PROXY=localhost,db".into());
        env.push("LW_SANDBOX=a".into());
        use_proxy_address(&mut env, &plan);
        assert!(env.contains(&"HTTPS_PROXY=http://10.96.0.7:3128".to_string()));
        assert!(env.contains(&"http_proxy=http://10.96.0.7:3128".to_string()));
        assert!(env.contains(&"NO_PROXY=localhost,db".to_string()));
        assert!(env.contains(&"LW_SANDBOX=a".to_string()));
        assert!(
            !env.iter().any(|e| e.contains(egress::PROXY_HOST)),
            "{env:?}"
        );
    }
}
