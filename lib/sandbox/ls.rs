//! What lw-sandbox shows of the sandboxes of a root: `ls` (state, ports,
//! unpushed commits, isolation level, services), `port`, `logs --egress`,
//! and the JSON records of `ls` and `create`.

use std::path::Path;
use std::time::Duration;

use super::{Created, Network, Port, Sandboxes, gone};
use agent::{Credential, proxy};
use base::error::{Error, Result};
use engine::{Isolation, NetworkEngine, PortMap};
use wall::egress;

/// The header `ls` prints above its lines (not with `--json` or
/// `--no-header`): the columns of [`Status::line`], tab-separated.
pub const HEADER: &str =
    "NAME\tBRANCH\tSTATE\tPORTS\tNETWORK\tAGE\tUNPUSHED\tISOLATION\tSERVICES\tAGENT";

/// The state of a sandbox as `ls` shows it.
#[derive(Clone, Debug)]
pub struct Status {
    pub name: String,
    pub branch: String,
    /// `running`, `exited`, `created`, `creating`, `lost` (the engine
    /// answered and its container is gone), `broken` (a dead create, for gc),
    /// `elsewhere` (made on another engine than this command reaches).
    pub state: String,
    /// How an `exited` one ended: its status (0 after a stop) and whether
    /// the OOM killer ended it at its memory limit; `line` shows them as
    /// `exited (N)` and `exited (OOM)` ([`engine::exit_state`]).
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub ports: Vec<Port>,
    pub created: String,
    pub age: Duration,
    /// Commits on the branch no upstream ref has; None when not running.
    pub unpushed: Option<u64>,
    pub container: String,
    pub image: String,
    pub network: Network,
    /// The shared services it is attached to.
    pub services: Vec<String>,
    /// The OCI runtime its container runs under (the engine's word when the
    /// container exists, else the record's).
    pub runtime: String,
    /// Its agent, when it has one.
    pub agent: Option<AgentStatus>,
}

/// The agent of a sandbox as `ls` shows it: its model proxy and what it spent.
#[derive(Clone, Debug)]
pub struct AgentStatus {
    pub kit: String,
    /// The model proxy container's state (`running`, `restarting`,
    /// `exited`, ...; `missing` when it is gone; `none` with `--credential env`).
    pub model: String,
    /// The proxy's counts (ROOT/state/agent-usage/NAME/usage.json), if any.
    pub usage: Option<proxy::Usage>,
}

impl AgentStatus {
    /// The proxy is not serving while its sandbox runs.
    pub fn model_down(&self, sandbox_state: &str) -> bool {
        sandbox_state == "running" && self.model != "running" && self.model != "none"
    }
}

impl<'a> Sandboxes<'a> {
    /// `ls`: every sandbox of the root.  A sandbox is `lost` only on the
    /// engine's word: when the engine does not answer, the listing fails
    /// (69, naming it) rather than calling every sandbox lost.
    pub fn list(&self, count_unpushed: bool) -> Result<Vec<Status>> {
        let containers = self.engine.containers_with_label(&self.root_label())?;
        let now = base::time::now();
        let mut out = Vec::new();
        for rec in self.records()? {
            let elsewhere = self.elsewhere(&rec);
            let c = containers
                .iter()
                .find(|c| c.name == rec.container && !elsewhere);
            let state = match (rec.ready, c) {
                _ if elsewhere => "elsewhere",
                (false, _) => {
                    if self.lock(&rec.name, false)?.is_some() {
                        "broken"
                    } else {
                        "creating"
                    }
                }
                (true, None) => "lost",
                (true, Some(c)) => c.status.as_str(),
            }
            .to_string();
            let created = base::time::parse_rfc3339(&rec.created).unwrap_or(now);
            let inspected = c.and_then(|c| self.engine.inspect(&c.name).ok().flatten());
            let exited = inspected.as_ref().filter(|_| state == "exited");
            let agent = rec.agent.as_ref().map(|a| AgentStatus {
                kit: a.kit.clone(),
                model: if a.credential == Credential::Env {
                    "none".into()
                } else {
                    let model = proxy::name(&rec.container);
                    containers
                        .iter()
                        .find(|c| c.name == model)
                        .map_or("missing".into(), |c| c.status.clone())
                },
                usage: proxy::usage(&self.root.state_dir(), &rec.name),
            });
            let unpushed = if count_unpushed && state == "running" {
                self.unpushed(&rec).ok().map(|u| u.0)
            } else {
                None
            };
            out.push(Status {
                name: rec.name.clone(),
                branch: rec.branch.clone(),
                state,
                exit_code: exited.and_then(|i| i.exit_code),
                oom_killed: exited.is_some_and(|i| i.oom_killed),
                ports: rec.ports.clone(),
                created: rec.created.clone(),
                age: now.saturating_sub(created),
                unpushed,
                container: rec.container.clone(),
                image: rec.image.clone(),
                network: rec.network,
                services: rec.services.clone(),
                runtime: inspected
                    .map(|i| i.runtime)
                    // Podman names every runtime "oci" here: the record knows.
                    .filter(|r| !r.is_empty() && r != "oci")
                    .unwrap_or_else(|| rec.runtime_name().to_string()),
                agent,
            });
        }
        Ok(out)
    }

    /// `logs --egress`: the requests the sandbox's proxy refused, oldest first.
    pub fn egress_denials(&self, name: &str) -> Result<Vec<egress::Request>> {
        let rec = self.get(name)?;
        if rec.network != Network::Egress {
            return Err(Error::usage(format!(
                "sandbox '{name}' has network '{}', not egress; only egress sandboxes have a proxy log",
                rec.network.as_str()
            )));
        }
        let nets: &dyn NetworkEngine = self.engine;
        egress::denials(nets, &rec.container)
    }

    /// `port`: the published ports, as the engine reports them.
    pub fn ports(&self, name: &str) -> Result<Vec<PortMap>> {
        let rec = self.get(name)?;
        let c = self
            .engine
            .inspect(&rec.container)?
            .ok_or_else(|| gone(&rec))?;
        if c.ports.is_empty() {
            // A stopped container reports no bindings; the record knows them.
            return Ok(rec
                .ports
                .iter()
                .map(|p| PortMap {
                    container: p.container.clone(),
                    host_ip: p.ip.clone().unwrap_or_else(|| "127.0.0.1".into()),
                    host_port: p.host,
                })
                .collect());
        }
        Ok(c.ports)
    }
}

fn ports_json(ports: &[Port]) -> serde_json::Value {
    ports
        .iter()
        .map(|p| serde_json::json!({"container": p.container, "host": p.address()}))
        .collect()
}

impl Created {
    /// `created NAME in Tms: step Tms, ...` (`create --verbose`).
    pub fn timings_line(&self) -> String {
        let steps: Vec<String> = self
            .timings
            .iter()
            .map(|(s, d)| format!("{s} {:.1}ms", d.as_secs_f64() * 1e3))
            .collect();
        let total: f64 = self
            .timings
            .iter()
            .map(|(_, d)| d.as_secs_f64() * 1e3)
            .sum();
        format!(
            "created {} in {total:.1}ms: {}",
            self.record.name,
            steps.join(", ")
        )
    }

    /// The `create --json` record (man page, JSON OUTPUT).
    pub fn json(&self, mailbox: &Path) -> serde_json::Value {
        let r = &self.record;
        let timings: serde_json::Map<String, serde_json::Value> = self
            .timings
            .iter()
            .map(|(s, d)| (s.to_string(), serde_json::json!(d.as_secs_f64() * 1e3)))
            .collect();
        serde_json::json!({
            "type": "sandbox", "name": r.name, "branch": r.branch, "head": self.head, "container": r.container,
            "image": r.image, "network": r.network.as_str(), "ports": ports_json(&r.ports), "mailbox": mailbox,
            "notes": self.notes, "timings_ms": timings,
        })
    }
}

impl Status {
    /// The `ls --json` record.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "sandbox", "name": self.name, "branch": self.branch, "state": self.state,
            "exit_code": self.exit_code, "oom_killed": self.oom_killed, "created": self.created,
            "age_secs": self.age.as_secs(), "unpushed": self.unpushed, "container": self.container, "image": self.image,
            "network": self.network.as_str(), "ports": ports_json(&self.ports), "services": self.services,
            "runtime": self.runtime, "isolation": Isolation::of(&self.runtime).as_str(),
            "agent": self.agent.as_ref().map(|a| {
                let u = a.usage.clone().unwrap_or_default();
                serde_json::json!({
                    "kit": a.kit, "model_proxy": a.model, "model_proxy_down": a.model_down(&self.state),
                    "tokens_hour": u.tokens_hour, "tokens_run": u.tokens_run, "tokens_total": u.tokens_total,
                    "requests_forwarded": u.forwarded, "requests_refused": u.refused,
                    "caps_reached": u.caps.len(),
                })
            }),
        })
    }

    /// The state column of `ls`: an exited sandbox says how it ended
    /// (`exited (2)`, `exited (OOM)`; plain `exited` after a stop).
    pub fn state_text(&self) -> String {
        if self.state == "exited" {
            engine::exit_state(self.exit_code, self.oom_killed)
        } else {
            self.state.clone()
        }
    }

    /// The agent column of `ls`: `-`, or the kit, its model proxy's state
    /// (`model-DOWN` when it is not serving a running sandbox) and the tokens
    /// of the last hour, `claude,model-up,1234-tokens/h`.
    pub fn agent_column(&self) -> String {
        let Some(a) = &self.agent else {
            return "-".into();
        };
        let model = if a.model_down(&self.state) {
            "model-DOWN".to_string()
        } else if a.model == "running" {
            "model-up".to_string()
        } else {
            format!("model-{}", a.model)
        };
        let tokens = a.usage.as_ref().map_or(0, |u| u.tokens_hour);
        format!("{},{model},{tokens}-tokens/h", a.kit)
    }

    /// The isolation column of `ls`: the level and its runtime, `gvisor(runsc)`.
    pub fn isolation(&self) -> String {
        format!(
            "{}({})",
            Isolation::of(&self.runtime).as_str(),
            self.runtime
        )
    }

    /// The `ls` line: name, branch, state, ports, network, age, unpushed,
    /// isolation, services, agent; tab-separated, under [`HEADER`].
    pub fn line(&self) -> String {
        let ports: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("{}->{}", p.address(), p.container))
            .collect();
        let ports = if ports.is_empty() {
            "-".to_string()
        } else {
            ports.join(",")
        };
        let unpushed = self.unpushed.map_or("-".to_string(), |n| n.to_string());
        let services = if self.services.is_empty() {
            "-".to_string()
        } else {
            self.services.join(",")
        };
        format!(
            "{}\t{}\t{}\t{ports}\t{}\t{}\t{unpushed}\t{}\t{services}\t{}",
            self.name,
            self.branch,
            self.state_text(),
            self.network.as_str(),
            base::time::human_age(self.age),
            self.isolation(),
            self.agent_column()
        )
    }
}
