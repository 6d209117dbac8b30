//! The limits a sandbox runs under, so that one sandbox cannot starve the
//! host or the others: CPUs, memory, processes, disk for its workspace and
//! its mail dir, its container log, and the size of what it may push.
//!
//! Each has a default, a key in `.loopwright/config` and (all but the log
//! and push limits) a flag of `create`.  A limit of 0, a negative one or
//! garbage is refused with exit 78 naming the key (64 naming the flag):
//! no limit is ever silently dropped.  The one way to run without a disk
//! quota is to say so, `sandbox.disk = off`, for hosts where lw-sandbox
//! cannot mount a loop filesystem (see lib/sandbox/disk.rs); `create` then
//! warns.

use base::config::Config;
use base::error::{Error, Result};

/// Workspace (`/work`) quota.
pub const DEFAULT_DISK: &str = "8g";
/// Mail dir (`/lw/mailbox`) quota.
pub const DEFAULT_MAIL_DISK: &str = "64m";
pub const DEFAULT_LOG_SIZE: &str = "10m";
pub const DEFAULT_LOG_FILES: u32 = 3;
pub const DEFAULT_PUSH_MAX: &str = "100m";

/// The limits of one sandbox.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// CPUs (`sandbox.cpus`, `--cpus`); default half the host's, at least 1.
    pub cpus: f64,
    /// Bytes of the workspace filesystem; None when `sandbox.disk = off`.
    pub disk: Option<u64>,
    /// Bytes of the mail dir's filesystem; None when `sandbox.disk = off`.
    pub mail_disk: Option<u64>,
    /// The container log's `max-size` (bytes) and `max-file`.
    pub log_size: u64,
    pub log_files: u32,
    /// The largest push (bytes of new objects) `push` sends on.
    pub push_max: u64,
}

/// Per-create overrides (`create --cpus --memory --pids --disk --mail-disk`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub cpus: Option<String>,
    pub memory: Option<String>,
    pub pids: Option<String>,
    pub disk: Option<String>,
    pub mail_disk: Option<String>,
}

/// The host's CPUs, for the default.
fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

pub fn default_cpus() -> f64 {
    (host_cpus() / 2.0).max(1.0)
}

/// `1`, `0.5`, `2.25`: a positive number of CPUs, at most the host's.
pub fn parse_cpus(s: &str) -> Option<f64> {
    let n: f64 = s.trim().parse().ok()?;
    (n.is_finite() && n >= 0.01 && n <= host_cpus()).then_some(n)
}

/// A size (`512m`, `8g`) as bytes, positive.
pub fn parse_size(s: &str) -> Option<u64> {
    base::config::parse_bytes(s).and_then(|n| u64::try_from(n).ok())
}

impl Limits {
    /// Reads the limits from the project's configuration.
    pub fn from_config(c: &Config) -> Result<Limits> {
        let bad = |k: &str, v: &str, want: &str| {
            Error::config(format!(
                "'{k} = {v}' in .loopwright/config: expected {want}"
            ))
        };
        let size = |k: &str, default: &str| -> Result<u64> {
            let v = c.get(k).unwrap_or(default);
            parse_size(v).ok_or_else(|| bad(k, v, "a size above 0, such as 512m or 8g"))
        };
        let cpus = match c.get("sandbox.cpus") {
            None => default_cpus(),
            Some(v) => parse_cpus(v).ok_or_else(|| {
                bad(
                    "sandbox.cpus",
                    v,
                    &format!("a number of CPUs above 0 and at most {}", host_cpus()),
                )
            })?,
        };
        let (disk, mail_disk) = match c.get("sandbox.disk") {
            Some("off") => (None, None),
            _ => (
                Some(size("sandbox.disk", DEFAULT_DISK)?),
                Some(size("sandbox.mail-disk", DEFAULT_MAIL_DISK)?),
            ),
        };
        let log_files = match c.get("sandbox.log-max-file") {
            None => DEFAULT_LOG_FILES,
            Some(v) => v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| bad("sandbox.log-max-file", v, "a number from 1 to 100"))?,
        };
        Ok(Limits {
            cpus,
            disk,
            mail_disk,
            log_size: size("sandbox.log-max-size", DEFAULT_LOG_SIZE)?,
            log_files,
            push_max: size("sandbox.push-max", DEFAULT_PUSH_MAX)?,
        })
    }

    /// Applies `create`'s flags (exit 64 naming the flag when bad).
    pub fn apply(&mut self, o: &Overrides) -> Result<()> {
        let bad = |flag: &str, v: &str, want: &str| {
            Error::usage(format!("{flag} '{v}' is not valid: expected {want}"))
        };
        if let Some(v) = &o.cpus {
            self.cpus = parse_cpus(v).ok_or_else(|| {
                bad(
                    "--cpus",
                    v,
                    &format!("a number of CPUs above 0 and at most {}", host_cpus()),
                )
            })?;
        }
        for (flag, v, slot) in [
            ("--disk", &o.disk, &mut self.disk),
            ("--mail-disk", &o.mail_disk, &mut self.mail_disk),
        ] {
            if let Some(v) = v {
                if slot.is_none() {
                    return Err(Error::usage(format!(
                        "{flag} needs a disk quota, which sandbox.disk = off turns off"
                    )));
                }
                *slot = Some(parse_size(v).ok_or_else(|| bad(flag, v, "a size such as 8g"))?);
            }
        }
        Ok(())
    }

    /// `--log-opt`s of the container's json-file log.
    pub fn log_options(&self) -> Vec<(String, String)> {
        vec![
            ("max-size".into(), self.log_size.to_string()),
            ("max-file".into(), self.log_files.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn cfg(text: &str) -> Config {
        Config::parse(text, Path::new("config")).unwrap()
    }

    #[test]
    fn zero_and_garbage_name_the_key() {
        for (text, key) in [
            ("sandbox.cpus = 0", "sandbox.cpus"),
            ("sandbox.cpus = many", "sandbox.cpus"),
            ("sandbox.cpus = 100000", "sandbox.cpus"),
            ("sandbox.disk = 0", "sandbox.disk"),
            ("sandbox.mail-disk = -1", "sandbox.mail-disk"),
            ("sandbox.log-max-size = 0", "sandbox.log-max-size"),
            ("sandbox.log-max-file = 0", "sandbox.log-max-file"),
            ("sandbox.push-max = lots", "sandbox.push-max"),
        ] {
            let e = Limits::from_config(&cfg(text)).unwrap_err();
            assert_eq!(e.exit, base::error::Exit::Config, "{text}");
            assert!(e.msg.contains(key), "{text}: {}", e.msg);
        }
    }

    #[test]
    fn defaults_and_overrides() {
        let mut l = Limits::from_config(&cfg("")).unwrap();
        assert_eq!(l.disk, Some(8 << 30));
        assert_eq!(l.mail_disk, Some(64 << 20));
        assert_eq!(l.push_max, 100 << 20);
        assert!(l.cpus >= 1.0);
        l.apply(&Overrides {
            cpus: Some("0.5".into()),
            disk: Some("1g".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((l.cpus, l.disk), (0.5, Some(1 << 30)));
        let e = l
            .apply(&Overrides {
                disk: Some("0".into()),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.msg.contains("--disk"), "{}", e.msg);
        let off = Limits::from_config(&cfg("sandbox.disk = off")).unwrap();
        assert_eq!((off.disk, off.mail_disk), (None, None));
    }
}
