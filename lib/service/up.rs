//! `lw-service up`: making a service run as its declaration says, on its
//! own network (and a publishing one when it publishes a port), hardened as
//! a sandbox is, with its secrets streamed in, and waiting until its
//! readiness check passes.  A container already running the same
//! declaration and image is left as it is.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::{Declaration, LABEL_CONFIG, LABEL_KIND, LABEL_READY, LABEL_SERVICE, Services};
use super::{container_name, network_name, publish_network_name, tail, volume_name};
use base::config::Project;
use base::error::{Error, Exit, Result};
use engine::NetworkEngine;
use engine::{Bind, ContainerSpec, ExecIo, ExecRequest, NetworkSpec, OutStream, PortMap};
use wall::LABEL_ROOT;
use wall::secrets::Secret;

/// Where the service's secrets appear, and the file that says all are there.
const SECRETS_READY: &str = "/run/secrets/.lw-ready";

/// What `up` did.
#[derive(Clone, Debug)]
pub struct Up {
    /// The image built (None when cached or given).
    pub built: Option<String>,
    pub image: String,
    /// True when the running container already matched the declaration.
    pub already: bool,
    pub took: Duration,
}

impl<'a> Services<'a> {
    /// `up`: makes the service run and waits until its readiness check passes.
    pub fn up(
        &self,
        project: &Project,
        d: &Declaration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Up> {
        let t0 = Instant::now();
        let allowed = wall::secrets::allowed(&project.config)?;
        wall::secrets::check_allowed(&d.secrets, &allowed)?;
        let secrets = wall::secrets::resolve(&d.secrets, &|n| std::env::var_os(n))?;
        let (image, built) = self.image(project, d, progress)?;
        let config = self.config_hash(d, &image)?;
        let container = container_name(&self.id, &d.name);
        if self.running_as_declared(&container, d, &config)? {
            self.wait_ready(d)?;
            return Ok(Up {
                built: None,
                image,
                already: true,
                took: t0.elapsed(),
            });
        }
        if let Some(h) = d.publish
            && let Err(e) = std::net::TcpListener::bind(("127.0.0.1", h))
        {
            return Err(port_taken(d, h, &e.to_string()));
        }
        let top = project.top.as_path();
        let (net, primary) = self.networks(d, top, progress)?;
        let mut binds = Vec::new();
        if let Some(path) = &d.volume {
            let v = volume_name(&self.id, &d.name);
            self.engine
                .create_volume(&v, &self.labels(&d.name, "volume", top))?;
            binds.push(Bind {
                source: v,
                target: path.clone(),
                read_only: false,
            });
        }
        let mut env: Vec<String> = d.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let egress_net = self.egress(project, d, &container, &mut env)?;
        let mut labels = self.labels(&d.name, "container", top);
        labels.insert(LABEL_CONFIG.into(), config);
        labels.insert(LABEL_READY.into(), d.ready.clone().unwrap_or_default());
        let mut spec = spec(d, &container, &image, !secrets.is_empty());
        spec.env = env;
        spec.labels = labels;
        spec.binds = binds;
        spec.network = Some(primary.clone().unwrap_or_else(|| net.clone()));
        self.engine.create(&spec)?;
        let made = self.join_and_start(
            d,
            &container,
            &net,
            primary.is_some(),
            &egress_net,
            &secrets,
        );
        if let Err(e) = made {
            // A port taken or a network refused: nothing half-made stays.
            let _ = self.engine.remove(&container, true);
            return Err(e);
        }
        if d.user.is_none() {
            self.warn_root(&container, d, progress);
        }
        self.wait_ready(d)?;
        Ok(Up {
            built: built.then_some(image.clone()),
            image,
            already: false,
            took: t0.elapsed(),
        })
    }

    /// The hash of the declaration and the image's id a container runs.
    fn config_hash(&self, d: &Declaration, image: &str) -> Result<String> {
        let image_id = self.engine.image(image)?.map(|i| i.id).unwrap_or_default();
        let h = Sha256::digest(format!("{}\n{image_id}\n", d.text).as_bytes());
        Ok(h[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>())
    }

    /// True when the service's container runs this very `config`; otherwise
    /// its container (if lw-service made it) is removed, to be made anew.
    fn running_as_declared(&self, container: &str, d: &Declaration, config: &str) -> Result<bool> {
        let Some(c) = self.engine.inspect(container)? else {
            return Ok(false);
        };
        if c.running && c.labels.get(LABEL_CONFIG).map(String::as_str) == Some(config) {
            return Ok(true);
        }
        if c.labels.get(LABEL_SERVICE) != Some(&d.name)
            || c.labels.get(LABEL_ROOT) != Some(&self.id)
        {
            return Err(Error::new(
                Exit::CantCreat,
                format!(
                    "a container named '{container}' exists that lw-service did not make; remove it"
                ),
            ));
        }
        self.remove_container(&d.name)?;
        Ok(false)
    }

    /// The service's network, and its publishing one when it publishes a port.
    fn networks(
        &self,
        d: &Declaration,
        top: &Path,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(String, Option<String>)> {
        let net = self.ensure_network(
            &d.name,
            &network_name(&self.id, &d.name),
            "network",
            true,
            top,
        )?;
        let primary = match d.publish {
            Some(_) => {
                progress(&format!(
                    "service '{}' publishes 127.0.0.1:{}: it is also on a network with a route out",
                    d.name,
                    d.publish.unwrap_or_default()
                ));
                Some(self.ensure_network(
                    &d.name,
                    &publish_network_name(&self.id, &d.name),
                    "publish",
                    false,
                    top,
                )?)
            }
            None => None,
        };
        Ok((net, primary))
    }

    /// The egress proxy of a service that declares `egress`: its variables
    /// go into `env`; returns its network.
    fn egress(
        &self,
        project: &Project,
        d: &Declaration,
        container: &str,
        env: &mut Vec<String>,
    ) -> Result<Option<String>> {
        let nets: &dyn NetworkEngine = self.engine;
        Ok(match &d.egress {
            Some(allow) => {
                let eg = wall::egress::Settings::from_config(&project.config)?;
                let mut o = wall::egress::Options::from(&eg);
                // Not the root's label: lw-sandbox gc tears down the egress
                // objects of that label that no sandbox record names.
                o.labels.insert(LABEL_SERVICE.into(), d.name.clone());
                let image =
                    wall::egress::ensure_proxy_image(self.images, &o.proxy_from, &mut |_| {})?;
                let plan = wall::egress::prepare_with_image(nets, container, allow, &image, &o)?;
                env.extend(plan.env);
                Some(plan.network)
            }
            None => None,
        })
    }

    /// Joins the service's networks (its alias NAME on its own), starts it
    /// and streams its secrets in.
    fn join_and_start(
        &self,
        d: &Declaration,
        container: &str,
        net: &str,
        has_primary: bool,
        egress_net: &Option<String>,
        secrets: &[Secret],
    ) -> Result<()> {
        let nets: &dyn NetworkEngine = self.engine;
        // The alias NAME on the service's network: the engine sets
        // aliases when a container joins a network, so the network the
        // container was created on is joined again.
        if !has_primary {
            nets.disconnect(net, container)?;
        }
        nets.connect(net, container, &[&d.name])?;
        if let Some(n) = &egress_net {
            nets.connect(n, container, &[])?;
        }
        self.engine
            .start(container)
            .map_err(|e| match engine::Refusal::of(&e) {
                Some(engine::Refusal::PortTaken(_)) => {
                    port_taken(d, d.publish.unwrap_or_default(), &e.to_string())
                }
                _ => e,
            })?;
        for s in secrets {
            self.exec_quiet(
                container,
                wall::secrets::install_cmd(&s.name),
                Some(s.value.clone()),
            )
            .map_err(|e| {
                Error::new(
                    e.exit,
                    format!(
                        "cannot write secret '{}' into service '{}': {}",
                        s.name, d.name, e.msg
                    ),
                )
            })?;
        }
        if !secrets.is_empty() {
            self.exec_quiet(
                container,
                vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    format!(": > {SECRETS_READY}"),
                ],
                None,
            )?;
        }
        Ok(())
    }

    /// Finds or makes the network `name` of `kind` for service `svc`.
    fn ensure_network(
        &self,
        svc: &str,
        net: &str,
        kind: &str,
        internal: bool,
        project: &Path,
    ) -> Result<String> {
        let nets: &dyn NetworkEngine = self.engine;
        let mine: Vec<_> = nets
            .networks_with_label(&format!("{LABEL_SERVICE}={svc}"))?
            .into_iter()
            .filter(|n| {
                n.name == net
                    && n.labels.get(LABEL_ROOT) == Some(&self.id)
                    && n.labels.get(LABEL_KIND).map(String::as_str) == Some(kind)
            })
            .collect();
        if let Some(n) = mine.first() {
            return Ok(n.id.clone());
        }
        if let Some(other) = nets.network(net)?
            && other.name == net
        {
            return Err(Error::new(
                Exit::CantCreat,
                format!("a network named '{net}' exists that lw-service did not make; remove it"),
            ));
        }
        Ok(nets
            .create_network(&NetworkSpec {
                name: net.to_string(),
                internal,
                no_host_address: internal,
                isolate_containers: !internal,
                labels: self.labels(svc, kind, project),
            })?
            .id)
    }

    /// Says when a service without `user` runs as root.
    fn warn_root(&self, container: &str, d: &Declaration, progress: &mut dyn FnMut(&str)) {
        let mut out = Vec::new();
        let req = ExecRequest {
            cmd: vec!["id".into(), "-u".into()],
            ..Default::default()
        };
        if let Ok(0) = self
            .engine
            .exec(container, &req, &mut |_, b| out.extend_from_slice(b))
            && String::from_utf8_lossy(&out).trim() == "0"
        {
            progress(&format!(
                "service '{}' runs as root (its image sets no other user); set 'user = NAME' in {}",
                d.name,
                d.path.display()
            ));
        }
    }

    /// Runs `cmd` in the service as its user; its output only in the error.
    fn exec_quiet(&self, container: &str, cmd: Vec<String>, stdin: Option<Vec<u8>>) -> Result<()> {
        let mut err = Vec::new();
        let mut on = |s: OutStream, b: &[u8]| {
            if s == OutStream::Stderr {
                err.extend_from_slice(b)
            }
        };
        let code = self.engine.exec_io(
            container,
            &ExecRequest {
                cmd,
                ..Default::default()
            },
            ExecIo {
                stdin: stdin.map(|b| Box::new(Cursor::new(b)) as Box<dyn std::io::Read + Send>),
                tty: false,
                size: None,
                on_output: &mut on,
                stop: None,
            },
        )?;
        if code != 0 {
            return Err(Error::new(
                Exit::Unavailable,
                format!("exit {code}: {}", tail(&err, 5)),
            ));
        }
        Ok(())
    }
}

/// The hardened container of a service, but for what `up` fills in
/// (environment, labels, binds, network).
fn spec(d: &Declaration, container: &str, image: &str, with_secrets: bool) -> ContainerSpec {
    let mut tmpfs = BTreeMap::from([
        (
            "/tmp".to_string(),
            "rw,noexec,nosuid,nodev,size=256m,mode=1777".to_string(),
        ),
        (
            "/run".to_string(),
            "rw,noexec,nosuid,nodev,size=64m,mode=1777".to_string(),
        ),
    ]);
    let entrypoint = d.command.as_ref().map(|cmd| {
        let script = if !with_secrets {
            cmd.clone()
        } else {
            // Wait for the secrets lw-service streams in after the start.
            format!("while [ ! -e {SECRETS_READY} ]; do sleep 0.05; done\n{cmd}")
        };
        vec!["/bin/sh".to_string(), "-c".to_string(), script]
    });
    if with_secrets {
        tmpfs.insert(
            wall::secrets::DIR.to_string(),
            "rw,noexec,nosuid,nodev,size=1m,mode=1733".to_string(),
        );
    }
    ContainerSpec {
        name: Some(container.to_string()),
        image: image.to_string(),
        entrypoint,
        cmd: vec![],
        user: d.user.clone(),
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: wall::security_options(),
        pids_limit: Some(d.pids),
        memory_bytes: Some(d.memory),
        nano_cpus: Some((d.cpus * 1e9) as i64),
        tmpfs,
        ports: match (d.port, d.publish) {
            (Some(p), Some(h)) => vec![PortMap {
                container: format!("{p}/tcp"),
                host_ip: "127.0.0.1".into(),
                host_port: h,
            }],
            _ => vec![],
        },
        log_options: [
            ("max-size".to_string(), "10m".to_string()),
            ("max-file".to_string(), "3".to_string()),
        ]
        .into(),
        cpu_shares: Some(512),
        ulimits: vec![("core".into(), 0, 0)],
        // Only the IPv4 its networks give it: no link-local IPv6 chatter
        // or address that the networks' rules do not govern.
        sysctls: [(
            "net.ipv6.conf.all.disable_ipv6".to_string(),
            "1".to_string(),
        )]
        .into(),
        ..Default::default()
    }
}

fn port_taken(d: &Declaration, host: u16, why: &str) -> Error {
    Error::new(
        Exit::Unavailable,
        format!(
            "port 127.0.0.1:{host} of service '{}' is already taken ({}); free it or change 'port' in {}",
            d.name,
            why.trim(),
            d.path.display()
        ),
    )
}
