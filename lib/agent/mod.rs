//! Real coding-agent CLIs inside the wall.
//!
//! - [`kit`]: the declarative kit files (runtime/agents/*.kit, a project's
//!   .loopwright/agents/*.kit); `grammar`: the grammar of their values.
//! - [`layer`]: the kit's CLI as its own image, copied above the deps layer.
//! - [`proxy`]: the model proxy that holds the key so the sandbox never does.
//! - [`context`]: the context file and MCP registration in the agent's HOME.
//! - [`run`]: `lw-sandbox run`, the headless command, its transcript.
//!
//! Per kit, `.loopwright/config` may say (an unknown `agent.KIT.` key is
//! exit 78):
//!
//! ```text
//! agent.claude.upstream = https://llm-gateway.example.com   # default: the kit's
//! agent.claude.ca       = certs/gateway-ca.pem              # a private CA
//! agent.claude.key-env  = CORP_ANTHROPIC_KEY                # default: the kit's key-env
//! agent.claude.key-file = /etc/loopwright/anthropic.key     # instead of key-env
//! ```

pub mod context;
pub mod doctor;
mod grammar;
pub mod kit;
pub mod layer;
pub mod proxy;
pub mod run;
pub mod setup;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::Project;
use crate::error::{Error, Exit, Result};
pub use kit::Kit;

/// Where the agent's key comes from on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    Env(String),
    File(PathBuf),
}

/// How the key reaches the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Credential {
    /// Through the model proxy; the sandbox holds a placeholder only.
    Proxy,
    /// In the agent's environment, inside the sandbox (weaker: the agent
    /// can read and send its key anywhere its allow-list reaches).
    Env,
}

/// The agent settings of one kit, from `.loopwright/config`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub upstream: String,
    pub ca: Option<PathBuf>,
    pub key: KeySource,
    /// Warnings to show (an `http://` upstream).
    pub warnings: Vec<String>,
}

impl Settings {
    pub fn from_project(project: Option<&Project>, kit: &Kit) -> Result<Settings> {
        let prefix = format!("agent.{}.", kit.name);
        let mut s = Settings {
            upstream: kit.upstream.clone(),
            ca: None,
            key: KeySource::Env(kit.key_env.clone()),
            warnings: vec![],
        };
        let Some(p) = project else { return Ok(s) };
        let file = crate::config::FILE;
        let mut key_env = None;
        let mut key_file = None;
        for (k, v) in p.config.iter() {
            let Some(rest) = k.strip_prefix(&prefix) else {
                continue;
            };
            if v.is_empty() {
                continue;
            }
            match rest {
                "upstream" => {
                    kit::parse_upstream(v)
                        .map_err(|m| Error::config(format!("{file}: {k}: {m}")))?;
                    s.upstream = v.trim_end_matches('/').to_string();
                }
                "ca" => {
                    let path = p.path(v);
                    if !path.is_file() {
                        return Err(Error::config(format!(
                            "{file}: {k}: '{}' is not a file",
                            path.display()
                        )));
                    }
                    s.ca = Some(path);
                }
                "key-env" => key_env = Some(v.to_string()),
                "key-file" => key_file = Some(p.path(v)),
                _ => {
                    return Err(Error::config(format!(
                        "{file}: unknown key '{k}'; agent keys are {prefix}upstream, {prefix}ca, {prefix}key-env and {prefix}key-file"
                    )));
                }
            }
        }
        s.key = match (key_env, key_file) {
            (Some(_), Some(_)) => {
                return Err(Error::config(format!(
                    "{file}: {prefix}key-env and {prefix}key-file both given; keep one"
                )));
            }
            (Some(e), None) => KeySource::Env(e),
            (None, Some(f)) => KeySource::File(f),
            (None, None) => s.key,
        };
        if s.upstream.starts_with("http://") {
            s.warnings.push(format!(
                "agent.{}.upstream is '{}': the key leaves the host unencrypted; use http:// only for a gateway on a private network",
                kit.name, s.upstream
            ));
        }
        Ok(s)
    }

    /// The key, read now.  Missing or empty is exit 78, naming where it was looked for.
    pub fn read_key(&self, kit: &Kit) -> Result<Vec<u8>> {
        match &self.key {
            KeySource::Env(var) => match std::env::var_os(var) {
                Some(v) if !v.is_empty() => Ok(v.into_encoded_bytes()),
                _ => Err(Error::config(format!(
                    "no key for agent '{}': {var} is not set on the host; export it (or set agent.{}.key-file in .loopwright/config); the agent was not started",
                    kit.name, kit.name
                ))),
            },
            KeySource::File(p) => {
                let b = std::fs::read(p).map_err(|e| {
                    Error::io_as(
                        Exit::Config,
                        &format!(
                            "no key for agent '{}': cannot read agent.{}.key-file",
                            kit.name, kit.name
                        ),
                        p,
                        e,
                    )
                })?;
                let trimmed = b.trim_ascii().to_vec();
                if trimmed.is_empty() {
                    return Err(Error::config(format!(
                        "no key for agent '{}': '{}' is empty; the agent was not started",
                        kit.name,
                        p.display()
                    )));
                }
                Ok(trimmed)
            }
        }
    }

    /// Where the key is taken from, for people.
    pub fn key_source(&self) -> String {
        match &self.key {
            KeySource::Env(v) => format!("${v}"),
            KeySource::File(p) => p.display().to_string(),
        }
    }
}

/// What a sandbox's record says about its agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub kit: String,
    pub credential: Credential,
    /// Added to the sandbox's environment: where the model is, placeholder
    /// credentials, the kit's own variables.  Never a key.
    pub env: Vec<String>,
}

/// The placeholder the agent holds instead of a key.
pub const PLACEHOLDER: &str = "lw-placeholder-the-model-proxy-holds-the-key";

/// The environment an agent sandbox gets (never the key).
pub fn sandbox_env(kit: &Kit, credential: Credential) -> Vec<String> {
    let mut env: Vec<String> = kit.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if credential == Credential::Proxy {
        if let Some(b) = &kit.base_url_env {
            env.push(format!("{b}={}", proxy::url()));
        }
        env.push(format!("{}={PLACEHOLDER}", kit.key_env));
    }
    env.push(format!("LW_AGENT={}", kit.name));
    env
}

/// The `NO_PROXY` value of an agent sandbox: the model proxy is reached directly.
pub fn no_proxy() -> String {
    format!("localhost,127.0.0.1,::1,{}", proxy::HOST)
}
