//! The sandbox settings: the `sandbox.*` keys of `.loopwright/config`, with
//! their defaults, and `create`'s limit flags over them.

use super::limits;
use base::config::Project;
use base::config::parse_bytes;
use base::error::{Error, Result};
use wall::ports::Range;
use wall::secrets;

/// Defaults, each overridable in `.loopwright/config`.
///
/// The sandbox's user is uid 100000, which is no account on the host (it
/// lies above the ranges useradd hands out and below the subordinate ids
/// of user namespaces): files a sandbox leaves in its mail dir or
/// workspace belong to nobody who could be impersonated through them.
pub const DEFAULT_UID: u32 = 100_000;
pub const DEFAULT_PIDS: i64 = 512;
pub const DEFAULT_MEMORY: &str = "2g";
pub const DEFAULT_TMP_SIZE: &str = "256m";

/// The `.loopwright/config` key of the sandboxes' OCI runtime.
pub const KEY_RUNTIME: &str = "sandbox.runtime";

/// The sandbox settings read from the project's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub uid: u32,
    pub pids: i64,
    pub memory: i64,
    pub tmp_size: String,
    pub ports: Range,
    pub allowed_secrets: Vec<String>,
    /// `door.secrets`: recorded in the registry so that the door knows
    /// them whatever its working directory (crates/mailbox/src/redact/names.rs).
    pub door_secrets: Vec<String>,
    /// `door.log-max` and `door.quarantine-max`, with the file they are
    /// in: recorded in the root with the secrets' names, so that the
    /// mediator applies them whatever its working directory.  None
    /// outside a project.
    pub door_budgets: Option<(mailbox::door_record::Budgets, std::path::PathBuf)>,
    pub git_name: Option<String>,
    pub git_email: Option<String>,
    /// The incremental install command (default: the deps layer's deps.sh).
    pub install: Option<String>,
    /// CPUs, disk, log and push limits (lib/sandbox/limits.rs).
    pub limits: limits::Limits,
    /// `sandbox.runtime`: the OCI runtime, `None` for the engine's default.
    pub runtime: Option<String>,
}

impl Settings {
    pub fn from_project(p: Option<&Project>) -> Result<Settings> {
        let empty = base::config::Config::default();
        let c = p.map(|p| &p.config).unwrap_or(&empty);
        let bad = |k: &str, v: &str, want: &str| {
            Error::config(format!(
                "'{k} = {v}' in .loopwright/config: expected {want}"
            ))
        };
        let uid = match c.get("sandbox.uid") {
            None => DEFAULT_UID,
            Some(v) => v
                .parse()
                .ok()
                .filter(|u| *u > 0)
                .ok_or_else(|| bad("sandbox.uid", v, "a non-zero user id"))?,
        };
        let pids = match c.get("sandbox.pids") {
            None => DEFAULT_PIDS,
            Some(v) => v
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("sandbox.pids", v, "a positive number"))?,
        };
        let mem = c.get("sandbox.memory").unwrap_or(DEFAULT_MEMORY);
        let memory = parse_bytes(mem)
            .ok_or_else(|| bad("sandbox.memory", mem, "a size such as 512m or 2g"))?;
        let tmp_size = c
            .get("sandbox.tmp-size")
            .unwrap_or(DEFAULT_TMP_SIZE)
            .to_string();
        if parse_bytes(&tmp_size).is_none() {
            return Err(bad("sandbox.tmp-size", &tmp_size, "a size such as 256m"));
        }
        let ports = Range::parse(
            c.get(wall::ports::KEY_RANGE)
                .unwrap_or(wall::ports::DEFAULT_RANGE),
        )?;
        Ok(Settings {
            uid,
            pids,
            memory,
            tmp_size,
            ports,
            allowed_secrets: secrets::allowed(c)?,
            door_secrets: mailbox::redact::door_names(c)?,
            door_budgets: match p {
                Some(p) => Some((
                    mailbox::door_record::Budgets::of_project(p)?,
                    p.top.join(base::config::FILE),
                )),
                None => None,
            },
            git_name: c.get("sandbox.git-name").map(str::to_string),
            git_email: c.get("sandbox.git-email").map(str::to_string),
            install: c.get("sandbox.install").map(str::to_string),
            limits: limits::Limits::from_config(c)?,
            runtime: match c.get(KEY_RUNTIME) {
                None => None,
                Some(v)
                    if !v.is_empty()
                        && v.chars()
                            .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)) =>
                {
                    Some(v.to_string())
                }
                Some(v) => return Err(bad(KEY_RUNTIME, v, "a runtime name such as runc or runsc")),
            },
        })
    }
}

/// `create`'s limit flags over the configuration's (exit 64 naming the flag).
pub(super) fn apply_overrides(settings: &mut Settings, o: &limits::Overrides) -> Result<()> {
    if let Some(v) = &o.memory {
        settings.memory = parse_bytes(v).ok_or_else(|| {
            Error::usage(format!(
                "--memory '{v}' is not valid: expected a size such as 512m or 2g"
            ))
        })?;
    }
    if let Some(v) = &o.pids {
        settings.pids = v.parse().ok().filter(|n: &i64| *n > 0).ok_or_else(|| {
            Error::usage(format!(
                "--pids '{v}' is not valid: expected a positive number"
            ))
        })?;
    }
    settings.limits.apply(o)
}
