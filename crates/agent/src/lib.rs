//! Real coding-agent CLIs inside the wall.
//!
//! - [`kit`]: the declarative kit files (runtime/agents/*.kit, a project's
//!   .loopwright/agents/*.kit); `grammar`: the grammar of their values.
//! - [`layer`]: the kit's CLI as its own image, copied above the deps layer.
//! - [`proxy`]: the model proxy that holds the key so the sandbox never does,
//!   and caps what the agent sends and spends; [`notice`]: a cap reached,
//!   told to the person.
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
//! agent.claude.max-request     = 8m         # a request body, at most (413 above)
//! agent.claude.max-rpm         = 60         # requests forwarded a minute (429 above)
//! agent.claude.max-tokens-hour = 10000000   # tokens the provider reports, an hour
//! agent.claude.max-tokens-run  = off        # ... and in one `lw-sandbox run`
//! agent.claude.bell-max-blocks = 3          # stops the bell may block a session
//! ```
//!
//! The caps are the model proxy's (crates/agent/src/proxy.rs); `off` (or 0) lifts
//! one.  `bell-max-blocks` is written into the kit's hooks at create
//! (crates/mailbox/src/bell.rs; 0: the bell never blocks a stop).

pub mod context;
pub mod doctor;
mod grammar;
pub mod kit;
pub mod layer;
mod lines;
pub mod notice;
pub mod proxy;
pub mod run;
pub mod setup;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use base::config::Project;
use base::error::{Error, Exit, Result};
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
    pub caps: Caps,
    /// `agent.KIT.bell-max-blocks`: stops the bell may block in a session.
    pub bell_max_blocks: u32,
}

/// What the model proxy lets one sandbox send (`agent.KIT.max-*`); 0 is no cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Bytes of one request body.
    pub max_request: u64,
    /// Requests forwarded in any minute.
    pub max_rpm: u64,
    /// Tokens (input, cache and output, as the provider's usage says) in any hour.
    pub max_tokens_hour: u64,
    /// Tokens in one `lw-sandbox run`.
    pub max_tokens_run: u64,
}

impl Default for Caps {
    /// Guards against a looping agent, not a budget: the largest request
    /// the kits sent in tests/agent_cli.rs is well under 1 MiB and a full
    /// 200k-token context about 1 MiB of JSON, so 8 MiB leaves room for an
    /// image or two; 60 requests a minute is above a busy CLI's pace; ten
    /// million tokens an hour (cache reads included) above a busy session's.
    fn default() -> Caps {
        Caps {
            max_request: 8 << 20,
            max_rpm: 60,
            max_tokens_hour: 10_000_000,
            max_tokens_run: 0,
        }
    }
}

impl Caps {
    /// The proxy container's environment.
    pub fn env(&self) -> Vec<String> {
        vec![
            format!("LW_MODEL_MAX_REQUEST={}", self.max_request),
            format!("LW_MODEL_MAX_RPM={}", self.max_rpm),
            format!("LW_MODEL_MAX_TOKENS_HOUR={}", self.max_tokens_hour),
            format!("LW_MODEL_MAX_TOKENS_RUN={}", self.max_tokens_run),
        ]
    }
}

/// A size above 0 (`8m`: bytes; the proxy's memory is bounded by it), or
/// for the other caps `off`, `0` or a count.
fn parse_cap(v: &str, size: bool) -> Option<u64> {
    let v = v.trim();
    if size {
        return base::config::parse_bytes(v).and_then(|n| u64::try_from(n).ok());
    }
    if v == "off" {
        return Some(0);
    }
    v.replace('_', "").parse::<u64>().ok()
}

impl Settings {
    pub fn from_project(project: Option<&Project>, kit: &Kit) -> Result<Settings> {
        let prefix = format!("agent.{}.", kit.name);
        let mut s = Settings {
            upstream: kit.upstream.clone(),
            ca: None,
            key: KeySource::Env(kit.key_env.clone()),
            warnings: vec![],
            caps: Caps::default(),
            bell_max_blocks: mailbox::bell::DEFAULT_MAX_BLOCKS,
        };
        let Some(p) = project else { return Ok(s) };
        let file = base::config::FILE;
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
                "max-request" | "max-rpm" | "max-tokens-hour" | "max-tokens-run" => {
                    let size = rest == "max-request";
                    let n = parse_cap(v, size).ok_or_else(|| {
                        Error::config(format!(
                            "{file}: {k} = {v}: expected {}",
                            if size {
                                "a size above 0 such as 8m (bytes)"
                            } else {
                                "a whole number, or off"
                            }
                        ))
                    })?;
                    match rest {
                        "max-request" => s.caps.max_request = n,
                        "max-rpm" => s.caps.max_rpm = n,
                        "max-tokens-hour" => s.caps.max_tokens_hour = n,
                        _ => s.caps.max_tokens_run = n,
                    }
                }
                "bell-max-blocks" => {
                    s.bell_max_blocks =
                        v.parse::<u32>().ok().filter(|n| *n <= 100).ok_or_else(|| {
                            Error::config(format!(
                                "{file}: {k} = {v}: expected a whole number from 0 to 100"
                            ))
                        })?;
                }
                _ => {
                    return Err(Error::config(format!(
                        "{file}: unknown key '{k}'; agent keys are {prefix}upstream, {prefix}ca, {prefix}key-env, {prefix}key-file, {prefix}max-request, {prefix}max-rpm, {prefix}max-tokens-hour, {prefix}max-tokens-run and {prefix}bell-max-blocks"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_read_sizes_counts_and_off_and_max_request_is_never_off() {
        assert_eq!(parse_cap("8m", true), Some(8 << 20));
        assert_eq!(parse_cap("300000", true), Some(300_000));
        assert_eq!(parse_cap("off", true), None, "the body cap bounds memory");
        assert_eq!(parse_cap("0", true), None);
        assert_eq!(parse_cap("20", false), Some(20));
        assert_eq!(parse_cap("10_000_000", false), Some(10_000_000));
        assert_eq!(parse_cap("off", false), Some(0));
        assert_eq!(parse_cap("lots", false), None);
        assert_eq!(parse_cap("-1", false), None);
        let env = Caps::default().env();
        assert!(
            env.contains(&"LW_MODEL_MAX_REQUEST=8388608".to_string()),
            "{env:?}"
        );
        assert!(
            env.contains(&"LW_MODEL_MAX_TOKENS_RUN=0".to_string()),
            "{env:?}"
        );
        assert_eq!(
            proxy::memory(8 << 20),
            128 << 20,
            "the old limit for the default"
        );
        assert_eq!(proxy::memory(64 << 20), (96 + 256) << 20);
    }
}
