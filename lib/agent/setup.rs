//! `lw-sandbox create --agent KIT`: the agent's part of a create, in order.
//!
//! [`Prepared::check`] runs with create's other checks, before anything is
//! made: the kit exists (64 listing the kits), its file and the project's
//! `agent.KIT.*` keys are sound (78), the network is egress.  Then the agent
//! image (lib/agent/layer.rs) replaces the project's image, the model proxy
//! is made beside the egress proxy, and after the clone the context file and
//! MCP registration are written into HOME.  The key is not needed to create
//! (`run` reads it, every time); when the host has it, create hands it to the
//! proxy already, for interactive use through `lw-sandbox shell`.

use std::collections::BTreeMap;

use super::kit::{self, Kit};
use super::{AgentRecord, Credential, Settings, context, layer, proxy};
use crate::config::Project;
use crate::engine::{BuildEvent, Engine};
use crate::error::{Error, Result};
use crate::image::Runtime;
use crate::layout::Root;
use crate::registry::Registry;
use crate::sandbox::{Network, Record, Sandboxes};

pub struct Prepared {
    pub kit: Kit,
    pub settings: Settings,
    pub credential: Credential,
}

impl Prepared {
    pub fn check(
        project: Option<&Project>,
        name: &str,
        credential: Credential,
        network: Network,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Prepared> {
        let kit = kit::find(project.map(|p| p.top.as_path()), name)?;
        let settings = Settings::from_project(project, &kit)?;
        if network != Network::Egress {
            return Err(Error::usage(format!(
                "--agent needs --network egress (the agent reaches its model through a proxy on the sandbox's own network), not --network {}",
                network.as_str()
            )));
        }
        for w in &settings.warnings {
            warn(w);
        }
        if credential == Credential::Env {
            warn(&format!(
                "--credential env: agent '{}' will hold its key INSIDE the sandbox, in its environment; \
                 it can read it and send it to {} or anything else its allow-list reaches. Prefer the default (the model proxy holds the key)",
                kit.name, settings.upstream
            ));
        }
        Ok(Prepared {
            kit,
            settings,
            credential,
        })
    }

    /// Allow-list entries the agent needs: its provider, when it holds its own key.
    pub fn allow(&self) -> Vec<String> {
        if self.credential != Credential::Env {
            return vec![];
        }
        match kit::parse_upstream(&self.settings.upstream) {
            Ok((_, host, port)) => vec![format!("{host}:{port}")],
            Err(_) => vec![],
        }
    }

    /// The agent image above `parent` (the project's image, or `--image`),
    /// built when missing; its CLI image starts from the project's first layer.
    pub fn image(
        &self,
        engine: &dyn Engine,
        project: Option<&Project>,
        parent: &str,
        flag: Option<&str>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String> {
        let (repo, cli_parent) = match (flag, project) {
            (None, Some(p)) => {
                let rt = Runtime::load(&p.top)?;
                let plan = rt.plan(engine)?;
                let first = plan
                    .layers
                    .first()
                    .expect("a runtime definition has at least one layer")
                    .tag
                    .clone();
                (rt.image, first)
            }
            _ => {
                let repo = parent
                    .rsplit_once(':')
                    .map(|(r, _)| r)
                    .unwrap_or(parent)
                    .to_string();
                (repo, parent.to_string())
            }
        };
        let planned = layer::plan(engine, &repo, &self.kit, &cli_parent, parent)?;
        let (tag, _) = layer::ensure(
            engine,
            &planned,
            &mut |p| {
                progress(&format!(
                    "building agent image {} (kit {})",
                    p.tag, self.kit.name
                ))
            },
            &mut |_: BuildEvent| {},
        )?;
        Ok(tag)
    }

    /// Makes and starts the model proxy of `rec` (proxy credential only).
    pub fn start_proxy(
        &self,
        nets: &dyn crate::engine::NetworkEngine,
        rec: &Record,
        eg: &crate::egress::Settings,
        root: &Root,
        labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        if self.credential != Credential::Proxy {
            return Ok(());
        }
        let image = proxy::ensure_image(nets, &eg.proxy_from, &mut |_| {})?;
        let dir = proxy::key_dir(&root.state_dir(), &rec.name);
        proxy::prepare_dir(&dir, &self.settings)?;
        // A key already on the host is handed to the proxy now, so that
        // `lw-sandbox shell` then the CLI works before any `run`.
        if let Ok(key) = self.settings.read_key(&self.kit) {
            proxy::write_key(&dir, &key)?;
        }
        let mut labels = labels.clone();
        labels.insert(crate::sandbox::LABEL_SANDBOX.to_string(), rec.name.clone());
        proxy::create(
            nets,
            &rec.container,
            &image,
            &eg.outside,
            &self.kit,
            &self.settings,
            &dir,
            &labels,
        )
    }

    pub fn record(&self) -> AgentRecord {
        AgentRecord {
            kit: self.kit.name.clone(),
            credential: self.credential,
            env: super::sandbox_env(&self.kit, self.credential),
        }
    }

    /// Writes the context file and the MCP registration into the sandbox's HOME.
    pub fn write_context(&self, sb: &Sandboxes, rec: &Record) -> Result<()> {
        let (peers, _) = Registry::new(&sb.root).list()?;
        for (rel, text) in context::files(
            &self.kit,
            self.credential,
            &rec.name,
            &rec.branch,
            &rec.scope,
            &peers,
        ) {
            let cmd = context::write_script(&rel);
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let (code, _, err) = sb.run(rec, &cmd, Some(text.into_bytes()))?;
            if code != 0 {
                return Err(Error::new(
                    crate::error::Exit::Unavailable,
                    format!(
                        "cannot write '{rel}' into the HOME of sandbox '{}': {}",
                        rec.name,
                        String::from_utf8_lossy(&err).trim()
                    ),
                ));
            }
        }
        Ok(())
    }
}
