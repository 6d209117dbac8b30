//! `lw-sandbox create --agent KIT`: the agent's part of a create, in order.
//!
//! [`Prepared::check`] runs with create's other checks, before anything is
//! made: the kit exists (64 listing the kits), its file and the project's
//! `agent.KIT.*` keys are sound (78); create then checks the network is
//! egress.  Then the agent image (crates/agent/src/layer.rs) replaces the project's
//! image, the model proxy is made beside the egress proxy, and after the
//! clone the context file and MCP registration are written into HOME.
//! lib/sandbox/agent.rs runs these steps: this module knows no sandbox.
//! The key is not needed to create (`run` reads it, every time); when the
//! host has it, create hands it to the proxy already, for interactive use
//! through `lw-sandbox shell`.

use std::collections::BTreeMap;

use super::kit::{self, Kit};
use super::{AgentRecord, Credential, Settings, layer, proxy};
use base::config::Project;
use base::error::Result;
use engine::{BuildEvent, ImageBuilder};
use mailbox::layout::Root;
use wall::image::Runtime;

pub struct Prepared {
    pub kit: Kit,
    pub settings: Settings,
    pub credential: Credential,
}

impl Prepared {
    /// The kit and its settings (64 naming the kits, 78 for a bad kit file
    /// or `agent.KIT.*` key).  The caller checks the network next, then
    /// shows [`Prepared::warnings`].
    pub fn check(
        project: Option<&Project>,
        name: &str,
        credential: Credential,
    ) -> Result<Prepared> {
        let kit = kit::find(project.map(|p| p.top.as_path()), name)?;
        let settings = Settings::from_project(project, &kit)?;
        Ok(Prepared {
            kit,
            settings,
            credential,
        })
    }

    /// What to tell the user before the create goes on: an `http://`
    /// upstream, a key held inside the sandbox.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = self.settings.warnings.clone();
        if self.credential == Credential::Env {
            out.push(format!(
                "--credential env: agent '{}' will hold its key INSIDE the sandbox, in its environment; \
                 it can read it and send it to {} or anything else its allow-list reaches. Prefer the default (the model proxy holds the key)",
                self.kit.name, self.settings.upstream
            ));
        }
        out
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
        engine: &dyn ImageBuilder,
        project: Option<&Project>,
        parent: &str,
        flag: Option<&str>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<String> {
        let (repo, cli_parent) = match (flag, project) {
            (None, Some(p)) => {
                let rt = Runtime::load(&p.top)?;
                let plan = rt.plan(engine)?;
                let first = plan.first_tag().to_string();
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

    /// Makes and starts the model proxy of sandbox `name`, whose container
    /// is `container` (proxy credential only); `labels` are the sandbox's.
    #[allow(clippy::too_many_arguments)]
    pub fn start_proxy(
        &self,
        nets: &dyn engine::NetworkEngine,
        images: &dyn ImageBuilder,
        name: &str,
        container: &str,
        eg: &wall::egress::Settings,
        root: &Root,
        labels: &BTreeMap<String, String>,
    ) -> Result<()> {
        if self.credential != Credential::Proxy {
            return Ok(());
        }
        let image = proxy::ensure_image(images, &eg.proxy_from, &mut |_| {})?;
        let dir = proxy::key_dir(&root.state_dir(), name);
        proxy::prepare_dir(&dir, &self.settings)?;
        // A key already on the host is handed to the proxy now, so that
        // `lw-sandbox shell` then the CLI works before any `run`.
        if let Ok(key) = self.settings.read_key(&self.kit) {
            proxy::write_key(&dir, &key)?;
        }
        proxy::create(
            nets,
            container,
            &image,
            &eg.outside,
            &self.kit,
            &self.settings,
            &dir,
            &proxy::usage_dir(&root.state_dir(), name),
            labels,
        )
    }

    pub fn record(&self) -> AgentRecord {
        AgentRecord {
            kit: self.kit.name.clone(),
            credential: self.credential,
            env: super::sandbox_env(&self.kit, self.credential),
        }
    }
}
