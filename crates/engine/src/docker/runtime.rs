//! The engine's runtimes and product (Docker or Podman), and what Podman's
//! Docker-compatible socket needs that dockerd does not.
//!
//! Podman 4's compatible API gives a container without explicit `nofile`
//! and `nproc` limits its own defaults, which a host without
//! CAP_SYS_RESOURCE refuses ("error setting rlimit type 7"); on Podman a
//! container spec without them gets the host's own hard limits, capped
//! below what Podman's service keeps for itself.  And Podman 4 reads `seccomp=VALUE` as the
//! path of a profile where dockerd takes the profile itself, so on Podman
//! an inline profile is written to a file of its own first.  Podman 4.3
//! refuses a tmpfs's `uid=`/`gid=` ("unknown mount option"); its own `U`
//! gives the tmpfs to the container's user, so on Podman a tmpfs owned by
//! that user is asked for with `U` instead.

use std::path::PathBuf;

use crate::{EngineInfo, RuntimeInfo};
use base::error::{Error, Exit, Result};

use super::DockerEngine;

/// Podman names its engine component this way in `/version`.
const PODMAN_COMPONENT: &str = "Podman Engine";

/// The ceilings of the limits given on Podman: below what its service keeps
/// for itself (it lowers its own `nproc` to 32768 on these hosts), and
/// `nproc` counts every process of the user across all its containers.
const NOFILE_CAP: u64 = 1 << 16;
const NPROC_CAP: u64 = 1 << 14;

impl DockerEngine {
    /// `/info` and `/version`, as the contract's [`EngineInfo`].
    pub(crate) fn engine_info(&self) -> Result<EngineInfo> {
        let v = self
            .block_on(self.client().version())
            .map_err(|e| self.err("cannot ask the engine its version", e))?;
        let podman = v
            .components
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == PODMAN_COMPONENT);
        let _ = self.podman.set(podman);
        let i = self
            .block_on(self.client().info())
            .map_err(|e| self.err("cannot ask the engine about itself", e))?;
        let mut runtimes: Vec<RuntimeInfo> = i
            .runtimes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, r)| RuntimeInfo {
                name,
                path: r.path.unwrap_or_default(),
                args: r.runtime_args.unwrap_or_default(),
            })
            .collect();
        runtimes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(EngineInfo {
            host: self.host().to_string(),
            product: if podman { "podman" } else { "docker" }.into(),
            version: v.version.unwrap_or_default(),
            runtimes,
            default_runtime: i.default_runtime.unwrap_or_else(|| "runc".into()),
            security: i.security_options.unwrap_or_default(),
        })
    }

    /// True when the engine is Podman (asked once per connection).
    pub(crate) fn is_podman(&self) -> bool {
        if let Some(p) = self.podman.get() {
            return *p;
        }
        let p = self
            .block_on(self.client().version())
            .ok()
            .and_then(|v| v.components)
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == PODMAN_COMPONENT);
        *self.podman.get_or_init(|| p)
    }

    /// The `nofile` and `nproc` limits a container spec lacks, on Podman:
    /// this host's hard limits, at most [`NOFILE_CAP`] and [`NPROC_CAP`].
    pub(crate) fn podman_ulimits(&self, have: &[(String, i64, i64)]) -> Vec<(String, i64, i64)> {
        if !self.host().starts_with("unix://") || !self.is_podman() {
            return Vec::new();
        }
        use rustix::process::{Resource, getrlimit};
        let mut out = Vec::new();
        for (name, res, cap) in [
            ("nofile", Resource::Nofile, NOFILE_CAP),
            ("nproc", Resource::Nproc, NPROC_CAP),
        ] {
            if have.iter().any(|(n, _, _)| n == name) {
                continue;
            }
            let hard = getrlimit(res).maximum.unwrap_or(cap).min(cap) as i64;
            out.push((name.to_string(), hard, hard));
        }
        out
    }

    /// `opts` as the engine takes them: on Podman an inline seccomp profile
    /// (`seccomp={...}`) becomes the path of a file holding it, in a
    /// directory of this user's alone, named by the profile's digest.
    pub(crate) fn engine_security_opt(&self, opts: &[String]) -> Result<Vec<String>> {
        if !opts.iter().any(|o| o.starts_with("seccomp={"))
            || !self.host().starts_with("unix://")
            || !self.is_podman()
        {
            return Ok(opts.to_vec());
        }
        let dir = profile_dir()?;
        opts.iter()
            .map(|o| match o.strip_prefix("seccomp=") {
                Some(p) if p.starts_with('{') => {
                    let path = dir.join(format!(
                        "seccomp-{}.json",
                        &base::digest::sha256_hex(p.as_bytes())[..16]
                    ));
                    if std::fs::read(&path).ok().as_deref() != Some(p.as_bytes()) {
                        base::fs::write_replace(
                            &path,
                            p.as_bytes(),
                            0o644,
                            base::fs::Durability::Unsynced,
                        )
                        .map_err(|e| Error::io("cannot write", &path, e))?;
                    }
                    Ok(format!("seccomp={}", path.display()))
                }
                _ => Ok(o.clone()),
            })
            .collect()
    }
}

/// A tmpfs's options as Podman takes them: `uid=N,gid=M` naming the
/// container's own user `N:M` become `U` (Podman chowns the tmpfs to it);
/// other owners cannot be said to Podman 4.3 and are refused (69).
pub(crate) fn podman_tmpfs_options(target: &str, opts: &str, user: Option<&str>) -> Result<String> {
    let (uid, gid) = match user.map(|u| u.split_once(':').unwrap_or((u, u))) {
        Some((u, g)) => (u, g),
        None => ("0", "0"),
    };
    let mut out: Vec<&str> = Vec::new();
    let mut owned = false;
    for o in opts.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("uid", v)) | Some(("gid", v)) => {
                let want = if o.starts_with("uid=") { uid } else { gid };
                if v != want {
                    return Err(Error::new(
                        Exit::Unavailable,
                        format!(
                            "Podman cannot give the tmpfs at {target} the owner {o} (only the container's user, {uid}:{gid}, through its 'U' option)"
                        ),
                    ));
                }
                owned = true;
            }
            _ => out.push(o),
        }
    }
    if owned {
        out.push("U");
    }
    Ok(out.join(","))
}

impl DockerEngine {
    /// The container's tmpfs mounts as the engine takes them (on Podman:
    /// [`podman_tmpfs_options`]).
    pub(crate) fn engine_tmpfs(
        &self,
        tmpfs: &std::collections::BTreeMap<String, String>,
        user: Option<&str>,
    ) -> Result<std::collections::HashMap<String, String>> {
        let podman = tmpfs
            .values()
            .any(|o| o.contains("uid=") || o.contains("gid="))
            && self.host().starts_with("unix://")
            && self.is_podman();
        tmpfs
            .iter()
            .map(|(t, o)| {
                let o = if podman {
                    podman_tmpfs_options(t, o, user)?
                } else {
                    o.clone()
                };
                Ok((t.clone(), o))
            })
            .collect()
    }
}

/// `$XDG_RUNTIME_DIR/loopwright`, else `TMPDIR/loopwright-UID`: made 0700
/// and refused unless this user owns it (no one else may swap a profile).
fn profile_dir() -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = rustix::process::getuid().as_raw();
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("loopwright"),
        None => std::env::temp_dir().join(format!("loopwright-{uid}")),
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("cannot create", &dir, e)),
    }
    let m = std::fs::symlink_metadata(&dir).map_err(|e| Error::io("cannot stat", &dir, e))?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(Error::new(
            Exit::NoPerm,
            format!(
                "'{}' is not a directory of this user's alone; remove it so that the seccomp profile for Podman can be written there",
                dir.display()
            ),
        ));
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_tmpfs_owner_becomes_u() {
        let o = "rw,noexec,nosuid,nodev,size=1m,mode=0700,uid=100000,gid=100000";
        assert_eq!(
            podman_tmpfs_options("/run/secrets", o, Some("100000:100000")).unwrap(),
            "rw,noexec,nosuid,nodev,size=1m,mode=0700,U"
        );
        assert_eq!(
            podman_tmpfs_options("/tmp", "rw,size=1m", Some("100000:100000")).unwrap(),
            "rw,size=1m"
        );
        let e = podman_tmpfs_options("/run/secrets", o, Some("1:1")).unwrap_err();
        assert_eq!(e.exit, Exit::Unavailable);
        assert!(e.msg.contains("/run/secrets"), "{}", e.msg);
    }
}
