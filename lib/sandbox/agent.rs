//! The agent's part of a sandbox (`create --agent`, `run`): the sandbox's
//! side of the steps crates/agent/ describes.  crates/agent/ knows kits, the model
//! proxy and the context file but no sandbox; this module hands it what a
//! sandbox's record says and runs its steps in the sandbox: the check before
//! anything is made, the context written into HOME after the clone, the
//! model proxy started and stopped with the sandbox, its key reclaimed with
//! it, and `run`.

use std::fs;
use std::io::Write;
use std::time::Duration;

use super::{CreateOptions, Network, Record, Sandboxes, io_err};
use agent::run::{Ran, RunOptions, Target};
use agent::setup::Prepared;
use agent::{Credential, context, proxy};
use base::config::Project;
use base::error::{Error, Exit, Result};
use engine::NetworkEngine;
use mailbox::registry::Registry;

impl Record {
    /// What crates/agent/ needs to know of this sandbox to run its agent.
    fn agent_target(&self) -> Target<'_> {
        Target {
            name: &self.name,
            container: &self.container,
            uid: self.uid,
            project: &self.project,
            agent: self.agent.as_ref(),
            runtime: self.runtime_name(),
        }
    }
}

/// `create --agent`'s check, read (and refused when bad, exit 78) before
/// anything is made: the kit and its settings, then the network, which must
/// be egress; then its warnings.
pub(super) fn check(
    project: Option<&Project>,
    opts: &CreateOptions,
    warn: &mut dyn FnMut(&str),
) -> Result<Option<Prepared>> {
    let Some((kit, cred)) = &opts.agent else {
        return Ok(None);
    };
    let a = Prepared::check(project, kit, *cred)?;
    if opts.network != Network::Egress {
        return Err(Error::usage(format!(
            "--agent needs --network egress (the agent reaches its model through a proxy on the sandbox's own network), not --network {}",
            opts.network.as_str()
        )));
    }
    for w in a.warnings() {
        warn(&w);
    }
    Ok(Some(a))
}

/// The `NO_PROXY` and agent variables of an agent sandbox's environment.
pub(super) fn env(rec: &Record, env: &mut Vec<String>) {
    if let Some(a) = &rec.agent {
        // The model proxy is reached directly, not through the egress proxy.
        env.retain(|e| !e.starts_with("NO_PROXY=") && !e.starts_with("no_proxy="));
        env.push(format!("NO_PROXY={}", agent::no_proxy()));
        env.push(format!("no_proxy={}", agent::no_proxy()));
        env.extend(a.env.iter().cloned());
    }
}

impl<'a> Sandboxes<'a> {
    /// `run`: the agent of sandbox `name`; progress goes to `out`, warnings to `warn`.
    pub fn run_agent(
        &self,
        name: &str,
        opts: &RunOptions,
        out: &mut dyn Write,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Ran> {
        let rec = self.get(name)?;
        agent::run::run(
            self.engine,
            &self.root,
            &rec.agent_target(),
            opts,
            out,
            warn,
        )
        .map_err(|e| super::running::died_under(name, None, e))
    }

    /// Writes the context file, the MCP registration and (claude) the bell's
    /// hooks into the sandbox's HOME.
    pub(super) fn write_agent_context(&self, a: &Prepared, rec: &Record) -> Result<()> {
        let (peers, _) = Registry::new(&self.root).list()?;
        for (rel, text) in context::files(
            &a.kit,
            a.credential,
            &rec.name,
            &rec.branch,
            &rec.scope,
            &peers,
            a.settings.bell_max_blocks,
        ) {
            let cmd = context::write_script(&rel);
            let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let (code, _, err) = self.run(rec, &cmd, Some(text.into_bytes()))?;
            if code != 0 {
                return Err(Error::new(
                    Exit::Unavailable,
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

    /// Starts the model proxy of an agent sandbox that has one.
    pub(super) fn start_model_proxy(&self, rec: &Record) -> Result<()> {
        if rec
            .agent
            .as_ref()
            .is_some_and(|a| a.credential == Credential::Proxy)
        {
            let nets: &dyn NetworkEngine = self.engine;
            proxy::start(nets, &rec.container)?;
        }
        Ok(())
    }

    /// Stops the model proxy of an agent sandbox, if it exists.
    pub(super) fn stop_model_proxy(&self, rec: &Record) -> Result<()> {
        let model = proxy::name(&rec.container);
        if rec.agent.is_some() && self.engine.inspect(&model)?.is_some() {
            self.engine.stop(&model, Duration::from_secs(10))?;
        }
        Ok(())
    }

    /// Removes the agent key and usage directories of sandbox `name`, if any.
    pub(super) fn remove_agent_key(&self, name: &str, out: &mut dyn FnMut(&str)) -> Result<()> {
        let keys = proxy::key_dir(&self.root.state_dir(), name);
        if keys.exists() {
            fs::remove_dir_all(&keys).map_err(io_err("cannot remove", &keys))?;
            out(&format!("agent-key {}", keys.display()));
        }
        let usage = proxy::usage_dir(&self.root.state_dir(), name);
        if usage.exists() {
            fs::remove_dir_all(&usage).map_err(io_err("cannot remove", &usage))?;
            out(&format!("agent-usage {}", usage.display()));
        }
        Ok(())
    }
}
