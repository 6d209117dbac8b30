//! Shared services: one database or API that chosen sandboxes reach, and
//! nothing else.
//!
//! A service is declared in `.loopwright/services/NAME` (decl.rs) and run by
//! `lw-service up NAME` as one hardened container of the mailbox root, on a
//! network of its own:
//!
//! ```text
//!   sandbox a ─┐
//!              ├─(lw-svc-ROOTID-NAME: internal, no host address)─ service, known there as NAME
//!   sandbox b ─┘
//!   sandbox c    (not attached: no route to the service, no DNS answer for NAME)
//! ```
//!
//! * The network is `internal` (no route out) and the host has no address
//!   on it, like a sandbox's egress network.  `lw-sandbox create --service
//!   NAME` attaches the sandbox to it (attach.rs); nothing else is on it.
//!   The service answers there to the DNS name NAME (a network alias); a
//!   sandbox that is not attached has no interface on that network, so it
//!   gets neither a route nor an answer.  Sandboxes attached to one service
//!   can reach each other over its network: they share the service, which
//!   is a channel between them anyway.
//! * The network and the data volume outlive the container: `down` removes
//!   the container only, so attached sandboxes stay attached and find the
//!   service again at the next `up`, with its data.  `rm` removes the
//!   network too (detaching the sandboxes), and the volume with `--volumes`.
//! * `port = HOST:PORT` publishes the port on 127.0.0.1:HOST.  Publishing
//!   needs a network the engine can forward to, so such a service is also
//!   on a network of its own that is not internal (`-pub`, containers
//!   isolated): it then has a route out, which `up` says.
//! * `egress = HOST:PORT ...` gives the service the sandboxes' egress proxy
//!   (lib/egress) and that allow-list; without it the service reaches
//!   nothing outside.
//! * Hardening as for sandboxes: no capabilities, no-new-privileges, the
//!   sandboxes' seccomp profile and AppArmor profile, a read-only root with
//!   tmpfs `/tmp` and `/run`, memory, pids and CPU limits, rotated logs, no
//!   core dumps.  The user is the declaration's `user`, else the image's own
//!   (`up` warns when that is root).
//! * Secrets (`secret = NAME ...`, allowed by `sandbox.secrets`) travel as a
//!   sandbox's do (lib/secrets.rs): streamed over exec into a tmpfs at
//!   `/run/secrets`; the command waits for them before it starts.
//!
//! Nothing is kept on disk: every engine object carries [`LABEL_SERVICE`],
//! the root's id and the project's path, which is how `ls` finds them and
//! `gc` knows a service whose declaration is gone.

pub mod attach;
pub mod decl;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub use decl::{Declaration, Source};

use crate::config::Project;
use crate::engine::{Bind, ContainerSpec, ExecIo, ExecRequest, NetworkSpec, OutStream, PortMap};
use crate::engine::{NetworkEngine, SandboxEngine};
use crate::error::{Error, Exit, Result};
use crate::wall::{LABEL_ROOT, LABEL_ROOT_PATH};

/// The service an engine object belongs to.
pub const LABEL_SERVICE: &str = "org.loopwright.service";
/// What it is: `container`, `network`, `publish`, `volume`.
pub const LABEL_KIND: &str = "org.loopwright.service.kind";
/// The project whose declaration it runs.
pub const LABEL_PROJECT: &str = "org.loopwright.service.project";
/// The hash of the declaration and image a container runs.
pub const LABEL_CONFIG: &str = "org.loopwright.service.config";

/// The readiness command a container runs (for `lw-sandbox create --service`).
pub const LABEL_READY: &str = "org.loopwright.service.ready";

/// Where the service's secrets appear, and the file that says all are there.
const SECRETS_READY: &str = "/run/secrets/.lw-ready";

/// The services of one mailbox root, on one engine.
pub struct Services<'a> {
    /// The root's id (lib/sandbox `root_id`).
    pub id: String,
    pub root_path: PathBuf,
    pub engine: &'a dyn SandboxEngine,
}

/// The object names of service NAME in root ID.
pub fn container_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}")
}
pub fn network_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}")
}
pub fn publish_network_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}-pub")
}
pub fn volume_name(id: &str, name: &str) -> String {
    format!("lw-svc-{id}-{name}-data")
}

/// How `ls` sees a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub name: String,
    /// `ready`, `unready` (running, its readiness check fails), `failed`
    /// (its container stopped by itself), `down` (no container), `orphan`
    /// (its declaration is gone; `gc` removes it).
    pub state: String,
    /// Why, when not ready: the readiness check's or the exit's words.
    pub detail: String,
    pub port: Option<u16>,
    pub publish: Option<u16>,
    /// Sandboxes attached to its network.
    pub sandboxes: Vec<String>,
    pub volume: Option<String>,
}

impl Status {
    pub fn line(&self) -> String {
        let port = match (self.port, self.publish) {
            (Some(p), Some(h)) => format!("{}:{p},127.0.0.1:{h}", self.name),
            (Some(p), None) => format!("{}:{p}", self.name),
            _ => "-".into(),
        };
        let sbs = if self.sandboxes.is_empty() {
            "-".to_string()
        } else {
            self.sandboxes.join(",")
        };
        let mut l = format!("{}\t{}\t{port}\t{sbs}", self.name, self.state);
        if !self.detail.is_empty() {
            l.push('\t');
            l.push_str(&crate::visible::visible_line(&self.detail));
        }
        l
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "service", "name": self.name, "state": self.state, "detail": self.detail,
            "port": self.port, "published": self.publish.map(|h| format!("127.0.0.1:{h}")),
            "sandboxes": self.sandboxes, "volume": self.volume,
        })
    }
}

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

fn tail(text: &[u8], n: usize) -> String {
    let t = String::from_utf8_lossy(text);
    let lines: Vec<&str> = t.lines().collect();
    crate::visible::visible(&lines[lines.len().saturating_sub(n)..].join("\n")).into_owned()
}

impl<'a> Services<'a> {
    pub fn new(root: &Path, engine: &'a dyn SandboxEngine) -> Services<'a> {
        Services {
            id: crate::wall::root_id(root),
            root_path: root.to_path_buf(),
            engine,
        }
    }

    fn labels(&self, name: &str, kind: &str, project: &Path) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_SERVICE.to_string(), name.to_string()),
            (LABEL_KIND.to_string(), kind.to_string()),
            (LABEL_ROOT.to_string(), self.id.clone()),
            (
                LABEL_ROOT_PATH.to_string(),
                self.root_path.to_string_lossy().into_owned(),
            ),
            (
                LABEL_PROJECT.to_string(),
                project.to_string_lossy().into_owned(),
            ),
        ])
    }

    /// The image of `d`: the local one it names, or its build (one lw-build
    /// layer, cached by the hash of its inputs).  Build output goes to `progress`.
    pub fn image(
        &self,
        project: &Project,
        d: &Declaration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<(String, bool)> {
        match &d.source {
            Source::Image(r) => {
                if !self.engine.image_exists(r)? {
                    return Err(Error::new(
                        Exit::NoInput,
                        format!(
                            "image '{r}' of service '{}' is not in the engine; build or load it, or declare 'build = DIR' in {}",
                            d.name,
                            d.path.display()
                        ),
                    ));
                }
                Ok((r.clone(), false))
            }
            Source::Build { dir, from } => {
                use crate::image::{InputDecl, LayerDef, Runtime};
                let df = format!("{dir}/Dockerfile");
                let runtime = Runtime {
                    root: project.top.clone(),
                    image: format!("loopwright/service-{}", d.name),
                    def: crate::image::Definition {
                        image: None,
                        from: from.clone(),
                        layers: vec![LayerDef {
                            name: "image".into(),
                            line: 1,
                            dockerfile: df.clone(),
                            dockerfile_line: 1,
                            provider: None,
                            inputs: vec![InputDecl {
                                path: dir.clone(),
                                line: 1,
                            }],
                        }],
                    },
                };
                let mut plan = runtime.plan(self.engine).map_err(|e| {
                    Error::new(
                        e.exit,
                        format!("service '{}' ({}): {}", d.name, d.path.display(), e.msg),
                    )
                })?;
                let tag = plan.final_tag().to_string();
                if plan.layers.iter().all(|l| l.cached()) {
                    return Ok((tag, false));
                }
                progress(&format!("building image {tag} for service '{}'", d.name));
                crate::image::build(
                    self.engine,
                    &mut plan,
                    &mut crate::image::BuildOptions {
                        on_event: &mut |_, ev| {
                            if let crate::engine::BuildEvent::Output(s) = ev {
                                for l in s.lines().filter(|l| l.starts_with("Step ")) {
                                    progress(l);
                                }
                            }
                        },
                        on_start: &mut |_| {},
                        // Built here, not pulled: the image cache is lw-build's.
                        fetch: None,
                    },
                )?;
                Ok((tag, true))
            }
        }
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

    /// `up`: makes the service run and waits until its readiness check passes.
    pub fn up(
        &self,
        project: &Project,
        d: &Declaration,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Up> {
        let t0 = Instant::now();
        let allowed = crate::secrets::allowed(&project.config)?;
        crate::secrets::check_allowed(&d.secrets, &allowed)?;
        let secrets = crate::secrets::resolve(&d.secrets, &|n| std::env::var_os(n))?;
        let (image, built) = self.image(project, d, progress)?;
        let image_id = self.engine.image(&image)?.map(|i| i.id).unwrap_or_default();
        let config = {
            let h = Sha256::digest(format!("{}\n{image_id}\n", d.text).as_bytes());
            h[..12]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let container = container_name(&self.id, &d.name);
        if let Some(c) = self.engine.inspect(&container)? {
            if c.running && c.labels.get(LABEL_CONFIG) == Some(&config) {
                self.wait_ready(d)?;
                return Ok(Up {
                    built: None,
                    image,
                    already: true,
                    took: t0.elapsed(),
                });
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
        }
        if let Some(h) = d.publish
            && let Err(e) = std::net::TcpListener::bind(("127.0.0.1", h))
        {
            return Err(port_taken(d, h, &e.to_string()));
        }
        let top = project.top.as_path();
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
        let nets: &dyn NetworkEngine = self.engine;
        let mut env: Vec<String> = d.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let egress_net = match &d.egress {
            Some(allow) => {
                let eg = crate::egress::Settings::from_config(&project.config)?;
                let mut o = crate::egress::Options::from(&eg);
                // Not the root's label: lw-sandbox gc tears down the egress
                // objects of that label that no sandbox record names.
                o.labels.insert(LABEL_SERVICE.into(), d.name.clone());
                let plan = crate::egress::prepare(nets, &container, allow, &o, &mut |_| {})?;
                env.extend(plan.env);
                Some(plan.network)
            }
            None => None,
        };
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
            let script = if secrets.is_empty() {
                cmd.clone()
            } else {
                // Wait for the secrets lw-service streams in after the start.
                format!("while [ ! -e {SECRETS_READY} ]; do sleep 0.05; done\n{cmd}")
            };
            vec!["/bin/sh".to_string(), "-c".to_string(), script]
        });
        if !secrets.is_empty() {
            tmpfs.insert(
                crate::secrets::DIR.to_string(),
                "rw,noexec,nosuid,nodev,size=1m,mode=1733".to_string(),
            );
        }
        let mut labels = self.labels(&d.name, "container", top);
        labels.insert(LABEL_CONFIG.into(), config);
        labels.insert(LABEL_READY.into(), d.ready.clone().unwrap_or_default());
        let spec = ContainerSpec {
            name: Some(container.clone()),
            image: image.clone(),
            entrypoint,
            cmd: vec![],
            env,
            user: d.user.clone(),
            labels,
            read_only_root: true,
            cap_drop: vec!["ALL".into()],
            security_opt: crate::wall::security_options(),
            pids_limit: Some(d.pids),
            memory_bytes: Some(d.memory),
            nano_cpus: Some((d.cpus * 1e9) as i64),
            tmpfs,
            binds,
            network: Some(primary.clone().unwrap_or_else(|| net.clone())),
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
        };
        self.engine.create(&spec)?;
        let made = (|| -> Result<()> {
            // The alias NAME on the service's network: the engine sets
            // aliases when a container joins a network, so the network the
            // container was created on is joined again.
            if primary.is_none() {
                nets.disconnect(&net, &container)?;
            }
            nets.connect(&net, &container, &[&d.name])?;
            if let Some(n) = &egress_net {
                nets.connect(n, &container, &[])?;
            }
            self.engine.start(&container).map_err(|e| {
                if e.msg.contains("port is already allocated")
                    || e.msg.contains("address already in use")
                {
                    port_taken(d, d.publish.unwrap_or_default(), &e.msg)
                } else {
                    e
                }
            })?;
            for s in &secrets {
                self.exec_quiet(
                    &container,
                    crate::secrets::install_cmd(&s.name),
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
                    &container,
                    vec![
                        "/bin/sh".into(),
                        "-c".into(),
                        format!(": > {SECRETS_READY}"),
                    ],
                    None,
                )?;
            }
            Ok(())
        })();
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

    /// Runs the readiness check once: Ok(None) when ready, Ok(Some(why)) when not.
    pub fn check(&self, name: &str, ready: Option<&str>) -> Result<Option<String>> {
        let container = container_name(&self.id, name);
        let c = match self.engine.inspect(&container)? {
            None => return Ok(Some("down".into())),
            Some(c) => c,
        };
        if !c.running {
            return Ok(Some(format!(
                "exited with status {}",
                c.exit_code.unwrap_or(-1)
            )));
        }
        let Some(ready) = ready else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let req = ExecRequest {
            cmd: vec!["/bin/sh".into(), "-c".into(), ready.to_string()],
            ..Default::default()
        };
        let code = self
            .engine
            .exec(&container, &req, &mut |_, b| out.extend_from_slice(b))?;
        Ok((code != 0).then(|| {
            let t = tail(&out, 1);
            format!(
                "readiness check '{ready}' exited {code}{}{t}",
                if t.is_empty() { "" } else { ": " }
            )
        }))
    }

    /// Waits until the readiness check passes; a container that stops is
    /// `failed` (69, with its log's last lines); a check still failing at
    /// the timeout is 69 saying so.
    fn wait_ready(&self, d: &Declaration) -> Result<()> {
        let container = container_name(&self.id, &d.name);
        let deadline = Instant::now() + d.ready_timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let why = self.check(&d.name, d.ready.as_deref())?;
            let Some(why) = why else { return Ok(()) };
            if why.starts_with("exited") || why == "down" {
                let log = self.log_text(&container)?;
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "service '{}' failed at start ({why}); no sandbox was attached; its log:\n{}",
                        d.name,
                        tail(&log, 20)
                    ),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::new(
                    Exit::Unavailable,
                    format!(
                        "service '{}' is not ready after {}s: {why}; see lw-service logs {}",
                        d.name,
                        d.ready_timeout.as_secs(),
                        d.name
                    ),
                ));
            }
            // A readiness command has no event to wait on: poll, backing off.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(250));
        }
    }

    fn log_text(&self, container: &str) -> Result<Vec<u8>> {
        let nets: &dyn NetworkEngine = self.engine;
        let mut log = nets.logs(container, true)?;
        log.extend(nets.logs(container, false)?);
        Ok(log)
    }

    /// `logs`: what the service wrote, standard output then standard error.
    pub fn logs(&self, name: &str) -> Result<Vec<u8>> {
        decl::check_name(name)?;
        let container = container_name(&self.id, name);
        if self.engine.inspect(&container)?.is_none() {
            return Err(Error::new(
                Exit::NoInput,
                format!("service '{name}' has no container (it is down); lw-service up {name}"),
            ));
        }
        self.log_text(&container)
    }

    fn remove_container(&self, name: &str) -> Result<bool> {
        let container = container_name(&self.id, name);
        let had = self.engine.inspect(&container)?.is_some();
        self.engine.remove(&container, true)?;
        let nets: &dyn NetworkEngine = self.engine;
        if !crate::egress::leftovers(nets, Some(&format!("{LABEL_SERVICE}={name}")))?.is_empty() {
            crate::egress::teardown(nets, &container)?;
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

    /// Sandbox names attached to the network of service `name`.
    pub fn sandboxes_of(&self, name: &str) -> Result<Vec<String>> {
        let nets: &dyn NetworkEngine = self.engine;
        let prefix = format!("lw-sb-{}-", self.id);
        Ok(match nets.network(&network_name(&self.id, name))? {
            Some(n) if n.labels.get(LABEL_ROOT) == Some(&self.id) => n
                .containers
                .keys()
                .filter_map(|c| c.strip_prefix(&prefix).map(str::to_string))
                .collect(),
            _ => vec![],
        })
    }

    /// Every service of this root the engine holds, with the project it came from.
    fn known(&self) -> Result<BTreeMap<String, PathBuf>> {
        let label = format!("{LABEL_ROOT}={}", self.id);
        let mut out = BTreeMap::new();
        let nets: &dyn NetworkEngine = self.engine;
        let labels = self
            .engine
            .containers_with_label(&label)?
            .into_iter()
            .map(|c| c.labels)
            .chain(
                nets.networks_with_label(&label)?
                    .into_iter()
                    .map(|n| n.labels),
            )
            .chain(
                self.engine
                    .volumes_with_label(&label)?
                    .into_iter()
                    .map(|v| v.labels),
            );
        for l in labels {
            if let (Some(n), Some(p)) = (l.get(LABEL_SERVICE), l.get(LABEL_PROJECT)) {
                out.insert(n.clone(), PathBuf::from(p));
            }
        }
        Ok(out)
    }

    /// `ls`: the project's declared services and every one this root runs.
    pub fn list(&self, project: Option<&Project>) -> Result<Vec<Status>> {
        let mut names: BTreeMap<String, Option<PathBuf>> = BTreeMap::new();
        if let Some(p) = project {
            for n in decl::names(p) {
                names.insert(n, Some(p.top.clone()));
            }
        }
        for (n, p) in self.known()? {
            names.entry(n).or_insert(Some(p));
        }
        let mut out = Vec::new();
        for (name, top) in names {
            let file = top.as_ref().map(|t| t.join(decl::DIR).join(&name));
            let d = match &file {
                Some(f) if f.exists() => Some(
                    std::fs::read_to_string(f)
                        .map_err(|e| Error::io_as(Exit::Config, "cannot read", f, e))
                        .and_then(|t| decl::parse(&name, &t, f)),
                ),
                _ => None,
            };
            let (state, detail, port, publish, volume) = match &d {
                None => (
                    "orphan".to_string(),
                    "its declaration is gone; lw-service gc".to_string(),
                    None,
                    None,
                    None,
                ),
                Some(Err(e)) => ("invalid".to_string(), e.msg.clone(), None, None, None),
                Some(Ok(d)) => {
                    let (state, detail) = match self.check(&name, d.ready.as_deref())? {
                        None => ("ready".to_string(), String::new()),
                        Some(w) if w == "down" => ("down".to_string(), String::new()),
                        Some(w) if w.starts_with("exited") => ("failed".to_string(), w),
                        Some(w) => ("unready".to_string(), w),
                    };
                    (state, detail, d.port, d.publish, d.volume.clone())
                }
            };
            out.push(Status {
                sandboxes: self.sandboxes_of(&name)?,
                name,
                state,
                detail,
                port,
                publish,
                volume,
            });
        }
        Ok(out)
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
