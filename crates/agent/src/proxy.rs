//! The model proxy: how an agent reaches its model without ever holding the key.
//!
//! ```text
//!   sandbox ──(KEY-egress, internal)── KEY-model ──(egress.network)── upstream (TLS)
//!            http://lw-model:8080       strips credentials, adds the key
//! ```
//!
//! One small container per agent sandbox, `KEY-model`, on the sandbox's own
//! internal network (where it is `lw-model`) and on the shared network that
//! leads out, like the egress proxy beside it.  It runs lw-model-proxy
//! (crates/model-proxy, on hyper, static, copied into an image of the base
//! `egress.proxy-from` with nothing installed; [`command`] finds it beside
//! lw-sandbox and its bytes are part of the image's tag): it forwards only
//! the kit's endpoints
//! (`POST /v1/messages`, `POST /v1/responses`, Gemini's
//! `POST /v1beta/models/{model}:streamGenerateContent` and its siblings) to
//! `agent.KIT.upstream`, drops every credential the agent sends (and a
//! `key=` or `api_key=` query parameter) and adds the real key, which it reads
//! for each request from a host file: `ROOT/state/agent-key/NAME/key`
//! (mode 0600, in a 0700 directory mounted read-only at `/run/lw-agent`).
//!
//! Why a container and not a host process: the sandbox's network has no host
//! address (crates/wall/src/egress/), so nothing on the host is reachable from it; a
//! container attached to that one network is reachable from that one
//! sandbox only, and it fails closed the same way (stopped, the agent has no
//! model).  Why a file and not the container's environment: an environment
//! is in `docker inspect` for as long as the container lives; the file is
//! written by `lw-sandbox run` from the host's variable (or copied from
//! `agent.KIT.key-file`) and removed by `rm`.  The container runs as the
//! user that runs lw-sandbox, read-only, without capabilities.
//!
//! It is also the sandbox's guard on spending (issue 35): a body cap
//! (`agent.KIT.max-request`, 413), strict heads (400), bounded memory, and
//! caps on requests a minute and tokens an hour and a run (429 with
//! retry-after); see crates/model-proxy/src/main.rs.  Its counts live in
//! `ROOT/state/agent-usage/NAME/usage.json` (mounted read-write at
//! `/run/lw-usage`, the only thing it may write), which `lw-sandbox ls`
//! shows and `lw-sandbox run` reads to tell the person of a cap reached.
//! The engine restarts it when it dies (`restart_on_failure`), so an agent
//! is never cut off for good.  The engine does not restart one that was
//! stopped or killed through it (`docker kill` counts as a stop, issue 40):
//! while `lw-sandbox run` runs, [`keep`] starts such a one again at once.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Settings;
use super::kit::Kit;
use base::error::{Error, Exit, Result};
use engine::NetworkEngine;
use engine::{Bind, BuildEvent, ContainerSpec, ImageBuilder};
use wall::egress::sidecar::{self, Recipe};

/// The proxy's name on the sandbox's internal network.
pub const HOST: &str = "lw-model";
pub const PORT: u16 = 8080;
/// Where proxy images are tagged.
pub const REPO: &str = "loopwright/model-proxy";
/// Label on the proxy container: the kit it serves.
pub const LABEL_AGENT: &str = "org.loopwright.agent";
const READY: &str = "lw-model-proxy: listening";

/// The proxy's command (crates/model-proxy), copied into its image.
pub const COMMAND: &str = "lw-model-proxy";
const DOCKERFILE: &[u8] = include_bytes!("../../../runtime/agents/model-proxy.Dockerfile");

/// lw-model-proxy beside the running program, where scripts/install puts it
/// (and cargo, in a checkout).
pub fn command() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default()
        .join(COMMAND)
}

/// The model proxy container of the sandbox container `key`.
pub fn name(key: &str) -> String {
    format!("{key}-model")
}

/// The URL the agent is given.
pub fn url() -> String {
    format!("http://{HOST}:{PORT}")
}

/// The host directory holding a sandbox's key (and CA), mounted into its proxy.
pub fn key_dir(state: &Path, sandbox: &str) -> PathBuf {
    state.join("agent-key").join(sandbox)
}

/// The host directory of a sandbox's usage counts, written by its proxy.
pub fn usage_dir(state: &Path, sandbox: &str) -> PathBuf {
    state.join("agent-usage").join(sandbox)
}

/// A cap reached: the first refusal after a forward, once per episode.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct CapEpisode {
    /// `max-rpm`, `max-tokens-hour` or `max-tokens-run`.
    pub cap: String,
    pub limit: u64,
    /// Unix time of the first refusal.
    pub at: i64,
    pub retry_after: u64,
    /// Counts episodes since the counts began.
    pub n: u64,
}

/// What a proxy's `usage.json` says.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct Usage {
    /// Unix time of the last update.
    pub updated: i64,
    pub tokens_run: u64,
    /// The hour up to `updated`.
    pub tokens_hour: u64,
    pub tokens_total: u64,
    pub forwarded: u64,
    pub refused: u64,
    pub caps: Vec<CapEpisode>,
}

/// The usage counts of sandbox `sandbox`, if its proxy wrote any.
pub fn usage(state: &Path, sandbox: &str) -> Option<Usage> {
    let text = fs::read(usage_dir(state, sandbox).join("usage.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// How the proxy image is made (crates/wall/src/egress/sidecar.rs): the Dockerfile and
/// the command's bytes, so a rebuilt proxy gives a new tag.
fn recipe<'a>(files: &'a [(&'a str, &'a [u8], u32)]) -> Recipe<'a> {
    Recipe {
        what: "the model proxy",
        version: "loopwright-model-proxy 2",
        repo: REPO,
        files,
        dockerfile: "model-proxy.Dockerfile",
        from_arg: "LW_MODEL_FROM",
    }
}

/// Makes sure the proxy image on `from` exists; returns its tag.
pub fn ensure_image(
    engine: &dyn ImageBuilder,
    from: &str,
    on_event: &mut dyn FnMut(BuildEvent),
) -> Result<String> {
    let Some(base) = engine.image(from)? else {
        return Err(Error::new(
            Exit::NoInput,
            format!(
                "the model proxy's base image '{from}' (egress.proxy-from) is not in the engine; load a Debian image"
            ),
        ));
    };
    let path = command();
    let bin = fs::read(&path).map_err(|e| {
        Error::new(
            Exit::NoInput,
            format!(
                "cannot read the model proxy's command '{}': {e}; scripts/install puts {COMMAND} beside lw-sandbox (in a checkout: cargo build --workspace)",
                path.display()
            ),
        )
    })?;
    let files: [(&str, &[u8], u32); 2] = [
        ("model-proxy.Dockerfile", DOCKERFILE, 0o644),
        (COMMAND, &bin, 0o755),
    ];
    let recipe = recipe(&files);
    let (tag, _) = recipe.tag(from, &base.id);
    if engine.image_exists(&tag)? {
        return Ok(tag);
    }
    let labels = BTreeMap::from([(LABEL_AGENT.to_string(), "model-proxy".to_string())]);
    recipe.build(engine, from, &tag, labels, "", on_event)?;
    Ok(tag)
}

/// Makes `dir` (0700) and its parents.
fn private_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(|e| Error::io("cannot create", parent, e))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("cannot create", dir, e)),
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io("cannot set the mode of", dir, e))
}

/// Makes the key directory (0700) and copies the CA into it.
pub fn prepare_dir(dir: &Path, settings: &Settings) -> Result<()> {
    private_dir(dir)?;
    let ca = dir.join("ca.pem");
    match &settings.ca {
        Some(src) => {
            fs::copy(src, &ca)
                .map_err(|e| Error::io_as(Exit::Config, "cannot copy the CA", src, e))?;
        }
        None => {
            let _ = fs::remove_file(&ca);
        }
    }
    Ok(())
}

/// Writes `key` into the key directory: a new 0600 file renamed over the
/// old one (the proxy reads it per request, through the directory mount).
pub fn write_key(dir: &Path, key: &[u8]) -> Result<()> {
    let path = dir.join("key");
    base::fs::write_replace(&path, key, 0o600, base::fs::Durability::Synced)
        .map_err(|e| Error::io("cannot write the key file", &path, e))
}

/// Writes the rate and token caps for the proxy to read at each request
/// (`max-request` is fixed when the proxy is made: its memory limit
/// follows from it).
pub fn write_caps(dir: &Path, caps: &super::Caps) -> Result<()> {
    let path = dir.join("caps");
    let doc = serde_json::json!({
        "max-rpm": caps.max_rpm, "max-tokens-hour": caps.max_tokens_hour,
        "max-tokens-run": caps.max_tokens_run,
    });
    base::fs::write_replace(
        &path,
        format!("{doc}\n").as_bytes(),
        0o600,
        base::fs::Durability::Unsynced,
    )
    .map_err(|e| Error::io("cannot write", &path, e))
}

/// Names the run that starts (its transcript's stem): the proxy counts
/// `agent.KIT.max-tokens-run` from 0 again when this changes.
pub fn write_run(dir: &Path, run: &str) -> Result<()> {
    let path = dir.join("run");
    base::fs::write_replace(
        &path,
        format!("{run}\n").as_bytes(),
        0o600,
        base::fs::Durability::Unsynced,
    )
    .map_err(|e| Error::io("cannot write", &path, e))
}

/// Creates and starts the proxy of sandbox container `key`, attached to the
/// shared network `outside` and to the sandbox's internal network.
#[allow(clippy::too_many_arguments)]
pub fn create(
    engine: &dyn NetworkEngine,
    key: &str,
    image: &str,
    outside: &str,
    kit: &Kit,
    settings: &Settings,
    dir: &Path,
    usage: &Path,
    labels: &BTreeMap<String, String>,
) -> Result<()> {
    let proxy = name(key);
    private_dir(usage)?;
    engine.remove(&proxy, true)?;
    let mut labels = labels.clone();
    labels.insert(LABEL_AGENT.to_string(), kit.name.clone());
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let spec = ContainerSpec {
        name: Some(proxy.clone()),
        image: image.to_string(),
        env: [
            format!("LW_MODEL_UPSTREAM={}", settings.upstream),
            format!("LW_MODEL_ENDPOINT={}", kit.endpoint()),
            format!("LW_MODEL_KEY_HEADER={}", kit.key_header.as_str()),
            format!("LW_MODEL_KIT={}", kit.name),
        ]
        .into_iter()
        .chain(settings.caps.env())
        .collect(),
        user: Some(format!("{uid}:{gid}")),
        labels,
        read_only_root: true,
        cap_drop: vec!["ALL".into()],
        security_opt: vec!["no-new-privileges".into()],
        pids_limit: Some(64),
        memory_bytes: Some(memory(settings.caps.max_request)),
        binds: vec![
            Bind {
                source: dir.to_string_lossy().into_owned(),
                target: "/run/lw-agent".into(),
                read_only: true,
            },
            Bind {
                source: usage.to_string_lossy().into_owned(),
                target: "/run/lw-usage".into(),
                read_only: false,
            },
        ],
        network: Some(outside.to_string()),
        restart_on_failure: true,
        ..Default::default()
    };
    engine.create(&spec)?;
    engine.connect(&wall::egress::network_name(key), &proxy, &[HOST])?;
    start(engine, key)
}

/// The proxy's memory limit: room for the command (tests/agent/model_proxy.rs
/// measures lw-model-proxy at a few MiB with 256 connections open; the
/// python it replaced, under 40 MiB) plus the bodies it may hold at once
/// (four of the largest, at least 32 MiB).
pub fn memory(max_request: u64) -> i64 {
    let budget = (4 * max_request).max(32 << 20);
    i64::try_from(96 * (1 << 20) + budget).unwrap_or(i64::MAX)
}

/// Starts the proxy of `key` if it is not running and waits until it listens.
pub fn start(engine: &dyn NetworkEngine, key: &str) -> Result<()> {
    let proxy = name(key);
    let what = "the model proxy";
    let timeout = Duration::from_secs(30);
    if let Some(log) = sidecar::start_until_ready(engine, what, &proxy, READY, timeout)? {
        return Err(Error::new(
            Exit::Unavailable,
            format!("{what} '{proxy}' did not start listening within 30s:\n{log}"),
        ));
    }
    Ok(())
}

/// How often [`keep`] looks at `done` while the proxy runs.
const KEEP_TICK: Duration = Duration::from_millis(500);

/// Keeps the proxy of sandbox container `key` running until `done`, and
/// says what it did.  The engine answers when the proxy exits; one left
/// stopped (a `docker kill` or `docker stop`, which the engine's restart
/// policy leaves alone) is started again while the sandbox runs.  Not when
/// the sandbox stopped: `lw-sandbox stop` stops the sandbox first, then the
/// proxy.  Nothing to do on an engine that restarts containers itself.
pub fn keep(engine: &dyn NetworkEngine, key: &str, done: &AtomicBool) -> Vec<String> {
    let proxy = name(key);
    let mut said = Vec::new();
    while !done.load(Ordering::Acquire) {
        let c = match engine.inspect(&proxy) {
            Ok(Some(c)) => c,
            Ok(None) => break,
            Err(e) => {
                said.push(format!("cannot watch the model proxy '{proxy}': {e}"));
                break;
            }
        };
        if !c.running && c.status != "restarting" {
            if !engine
                .inspect(key)
                .is_ok_and(|s| s.is_some_and(|s| s.running))
            {
                break;
            }
            let t = std::time::Instant::now();
            match start(engine, key) {
                Ok(()) => said.push(format!(
                    "the model proxy '{proxy}' was stopped from outside the run ({}, exit {}); started again in {:.1}s",
                    c.status,
                    c.exit_code.unwrap_or(-1),
                    t.elapsed().as_secs_f64()
                )),
                Err(e) => {
                    said.push(format!("cannot start the model proxy again: {e}"));
                    break;
                }
            }
        }
        match engine.wait_exit(&proxy, KEEP_TICK) {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                said.push(format!("cannot watch the model proxy '{proxy}': {e}"));
                break;
            }
        }
    }
    said
}

/// One line of the proxy's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Logged {
    pub time: String,
    /// `forward`, `deny`, `nokey`, `fail`, `refuse` (400, 413, 429, 503).
    pub action: String,
    pub method: String,
    pub path: String,
    pub upstream: String,
    pub status: Option<u16>,
}

/// Every request the proxy of `key` logged, oldest first.
pub fn requests(engine: &dyn NetworkEngine, key: &str) -> Result<Vec<Logged>> {
    let text = String::from_utf8_lossy(&engine.logs(&name(key), false)?).into_owned();
    Ok(text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [t, a, m, p, u, rest @ ..]
                    if ["forward", "deny", "nokey", "fail", "refuse"].contains(a) =>
                {
                    Some(Logged {
                        time: t.to_string(),
                        action: a.to_string(),
                        method: m.to_string(),
                        path: p.to_string(),
                        upstream: u.to_string(),
                        status: rest.first().and_then(|s| s.parse().ok()),
                    })
                }
                _ => None,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rebuilt lw-model-proxy gives a new image tag (issue 42): its bytes
    /// are hashed with the Dockerfile and the base.
    #[test]
    fn the_image_tag_hashes_the_commands_bytes() {
        let tag = |bin: &[u8]| {
            let files: [(&str, &[u8], u32); 2] = [
                ("model-proxy.Dockerfile", DOCKERFILE, 0o644),
                (COMMAND, bin, 0o755),
            ];
            recipe(&files).tag("debian:trixie", "sha256:base").0
        };
        assert_ne!(tag(b"\x7fELF one"), tag(b"\x7fELF two"));
        assert_eq!(tag(b"\x7fELF one"), tag(b"\x7fELF one"));
        assert!(tag(b"x").starts_with("loopwright/model-proxy:"));
    }
}
