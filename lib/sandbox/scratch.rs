//! The writable scratch places of a gVisor sandbox (`/tmp`, `/dev/shm`) on
//! a host tmpfs mounted `noexec`, bound in.
//!
//! Why: gVisor (Debian's runsc, 2022-12) keeps `noexec` of its own tmpfs for
//! `execve` only; it maps a file of such a mount executable when asked, so
//! `ld.so /tmp/copy` runs a program there that `/tmp/copy` may not (fixed in
//! gVisor by google/gvisor#11358, January 2025).  A file of a host bind
//! mount, though, is mapped through the host's own descriptor, and the
//! host's kernel refuses an executable mapping of a file on a `noexec`
//! filesystem: the loader dies with SIGSEGV.  So under gVisor no writable
//! place but the workspace (executable by design: builds run there) is
//! mapped executable.  Under runc the container's own tmpfs mounts stay.
//!
//! | host                               | inside     | owner, mode |
//! |------------------------------------|------------|-------------|
//! | `ROOT/state/disk/NAME.scratch/tmp` | `/tmp`     | root, 1777 |
//! | `ROOT/state/disk/NAME.scratch/shm` | `/dev/shm` | root, 1777 |
//!
//! One tmpfs of `sandbox.tmp-size` holds both (memory, as the container's
//! own tmpfs); it goes with the sandbox.  Mounting needs root, as the disk
//! quotas do.  `/run/secrets` stays the container's own tmpfs (a secret
//! must never sit in a host directory): with `--secret`, it is the one
//! writable place gVisor would still map executable (docs/engines.md).

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::Command;

use base::error::{Error, Exit, Result};
use engine::{Bind, Isolation};
use mailbox::layout::Root;

use super::disk::is_mounted;

/// True when a sandbox under `runtime` gets its scratch places from the host.
pub fn needed(runtime: &str) -> bool {
    Isolation::of(runtime) == Isolation::Gvisor
}

/// The mount point of sandbox `name`'s scratch tmpfs.
pub fn dir(root: &Root, name: &str) -> PathBuf {
    root.state_dir()
        .join("disk")
        .join(format!("{name}.scratch"))
}

const PLACES: [(&str, &str); 2] = [("tmp", "/tmp"), ("shm", "/dev/shm")];

/// Mounts the scratch tmpfs (unless mounted) and makes its three places.
pub fn make(root: &Root, name: &str, size: &str) -> Result<()> {
    let d = dir(root, name);
    if !is_mounted(&d) {
        fs::create_dir_all(&d).map_err(|e| Error::io("cannot create", &d, e))?;
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("noexec,nosuid,nodev,size={size},mode=0755"))
            .arg("lw-scratch")
            .arg(&d)
            .output()
            .map_err(|e| Error::io("cannot run mount for", &d, e))?;
        if !o.status.success() {
            return Err(Error::new(
                Exit::Unavailable,
                format!(
                    "cannot mount the noexec scratch tmpfs of gVisor sandbox '{name}' at '{}': {}; lw-sandbox needs root for a gVisor sandbox",
                    d.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            ));
        }
    }
    for (sub, _) in PLACES {
        let p = d.join(sub);
        match fs::create_dir(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("cannot create", &p, e)),
        }
        std::os::unix::fs::lchown(&p, Some(0), Some(0))
            .map_err(|e| Error::io("cannot chown", &p, e))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o1777))
            .map_err(|e| Error::io("cannot set the mode of", &p, e))?;
    }
    Ok(())
}

/// The binds that replace the container's own `/tmp` and `/dev/shm`.
pub fn binds(root: &Root, name: &str) -> Vec<Bind> {
    let d = dir(root, name);
    PLACES
        .iter()
        .map(|(sub, target)| Bind {
            source: d.join(sub).to_string_lossy().into_owned(),
            target: target.to_string(),
            read_only: false,
        })
        .collect()
}

/// Unmounts (lazily when busy) and removes the scratch tmpfs; true when
/// there was one.
pub fn remove(root: &Root, name: &str) -> Result<bool> {
    let d = dir(root, name);
    let had = d.exists();
    if is_mounted(&d) {
        let ok = |args: &[&str]| {
            Command::new("umount")
                .args(args)
                .arg(&d)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok(&[]) && !ok(&["-l"]) {
            return Err(Error::new(
                Exit::IoErr,
                format!("cannot unmount '{}'", d.display()),
            ));
        }
    }
    if !is_mounted(&d) {
        match base::fs::remove_tree(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot remove", &d, e)),
        }
    }
    Ok(had)
}

/// Host tasks per process of a gVisor sandbox, measured with this runsc
/// (ptrace platform): 45 for an idle sandbox, about 10 more per process.
pub const GVISOR_PIDS_FACTOR: i64 = 16;

/// The engine's pids limit for a sandbox of `pids` processes under
/// `runtime`.  Under runc it counts the sandbox's processes; under gVisor it
/// counts the host tasks of the sentry and its stubs, and gVisor keeps no
/// count of its own (neither a pids cgroup inside nor RLIMIT_NPROC), so
/// 512 would stop a sandbox at about 45 processes: the sentry, denied a
/// thread, exits.  The limit is scaled so that `pids` processes fit; a fork
/// bomb still ends at the host's limit, with the sandbox (not the host).
pub fn host_pids(runtime: &str, pids: i64) -> i64 {
    if needed(runtime) {
        pids.saturating_mul(GVISOR_PIDS_FACTOR)
    } else {
        pids
    }
}
