//! Disk quotas: a sandbox's workspace and its mail dir each live on an ext4
//! filesystem of their own, in a sparse image file of the quota's size,
//! loop-mounted by the host.
//!
//! Why a loop filesystem: the host's filesystem (ext4 without project
//! quota, typically) cannot cap one directory, and Docker's `--storage-opt
//! size` needs xfs.  An image file caps what the sandbox can write at its
//! size — the sandbox gets ENOSPC, the host loses at most the quota, other
//! sandboxes nothing — on any filesystem, and the mount carries the options
//! the sandbox must not escape: `nosuid,nodev` for the workspace, and
//! `nosuid,nodev,noexec` for the mail dir, which the host's own users and
//! the mediator read (a setuid file planted there runs as nobody's owner).
//! Bind mounts into the container inherit those options.
//!
//! | image                         | mounted at                  | options               |
//! |-------------------------------|-----------------------------|-----------------------|
//! | `ROOT/state/disk/NAME.work.img` | `ROOT/state/disk/NAME.work` | nosuid,nodev          |
//! | `ROOT/state/disk/NAME.mail.img` | `ROOT/sandboxes/NAME`       | nosuid,nodev,noexec   |
//!
//! Mounting needs root and loop devices.  Where lw-sandbox cannot mount,
//! `create` fails (exit 69) saying so; `sandbox.disk = off` runs without
//! a quota, and `create` warns.  A host reboot loses the mounts, not the
//! images: `start` mounts them again before the container starts.

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use base::error::{Error, Exit, Result};
use mailbox::layout::Root;

/// One of a sandbox's two filesystems.
#[derive(Clone, Debug)]
pub struct Disk {
    pub image: PathBuf,
    pub mount: PathBuf,
    /// Mount options besides `loop`.
    pub options: &'static str,
}

fn disk_dir(root: &Root) -> PathBuf {
    root.state_dir().join("disk")
}

/// The workspace filesystem of sandbox `name`.
pub fn work(root: &Root, name: &str) -> Disk {
    Disk {
        image: disk_dir(root).join(format!("{name}.work.img")),
        mount: disk_dir(root).join(format!("{name}.work")),
        options: "nosuid,nodev",
    }
}

/// The mail dir filesystem of sandbox `name`.
pub fn mail(root: &Root, name: &str) -> Disk {
    Disk {
        image: disk_dir(root).join(format!("{name}.mail.img")),
        mount: root.sandbox(name).dir,
        options: "nosuid,nodev,noexec",
    }
}

fn run(cmd: &mut Command, what: &str) -> std::result::Result<(), String> {
    match cmd.output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("cannot run {what}: {e}")),
    }
}

/// True when `dir` is a mount point (its device differs from its parent's).
pub fn is_mounted(dir: &Path) -> bool {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    match (fs::symlink_metadata(dir), fs::metadata(parent)) {
        (Ok(d), Ok(p)) => d.is_dir() && d.dev() != p.dev(),
        _ => false,
    }
}

impl Disk {
    fn unavailable(&self, why: String) -> Error {
        Error::new(
            Exit::Unavailable,
            format!(
                "cannot enforce the disk quota at '{}': {why}; lw-sandbox needs root, loop devices and mkfs.ext4 for it (or set sandbox.disk = off to run without a quota)",
                self.mount.display()
            ),
        )
    }

    /// Makes the image (`bytes` long, sparse), an ext4 filesystem in it
    /// whose top directory belongs to `uid` with `mode`, and mounts it.
    pub fn make(&self, bytes: u64, uid: u32, mode: u32) -> Result<()> {
        if let Some(d) = self.image.parent() {
            fs::create_dir_all(d).map_err(|e| Error::io("cannot create", d, e))?;
            let _ = fs::set_permissions(d, fs::Permissions::from_mode(0o700));
        }
        let f = fs::File::options()
            .write(true)
            .create_new(true)
            .open(&self.image)
            .map_err(|e| Error::io("cannot create the disk image", &self.image, e))?;
        f.set_len(bytes)
            .map_err(|e| Error::io("cannot size the disk image", &self.image, e))?;
        drop(f);
        run(
            Command::new("mkfs.ext4")
                .args(["-q", "-F", "-m", "0", "-E"])
                .arg(format!(
                    "lazy_itable_init=1,lazy_journal_init=1,root_owner={uid}:{uid}"
                ))
                .arg(&self.image),
            "mkfs.ext4",
        )
        .map_err(|w| self.unavailable(w))?;
        self.mount()?;
        // A directory of root's would show inside, and count as junk there.
        let _ = fs::remove_dir(self.mount.join("lost+found"));
        fs::set_permissions(&self.mount, fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io("cannot set the mode of", &self.mount, e))
    }

    /// Mounts the image unless it is mounted (a reboot unmounts it).
    pub fn mount(&self) -> Result<()> {
        if is_mounted(&self.mount) {
            return Ok(());
        }
        if !self.image.is_file() {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "the disk image '{}' is missing; remove the sandbox (lw-sandbox rm --force) and create it again",
                    self.image.display()
                ),
            ));
        }
        fs::create_dir_all(&self.mount).map_err(|e| Error::io("cannot create", &self.mount, e))?;
        run(
            Command::new("mount")
                .arg("-o")
                .arg(format!("loop,noinit_itable,{}", self.options))
                .arg(&self.image)
                .arg(&self.mount),
            "mount -o loop",
        )
        .map_err(|w| self.unavailable(w))
    }

    /// Without a quota (`sandbox.disk = off`): a plain directory at the
    /// mount point, given to `uid`.
    pub fn plain(&self, uid: u32) -> Result<()> {
        fs::create_dir_all(&self.mount).map_err(|e| Error::io("cannot create", &self.mount, e))?;
        std::os::unix::fs::lchown(&self.mount, Some(uid), Some(uid)).map_err(|e| {
            Error::io_as(
                Exit::NoPerm,
                &format!("cannot give the workspace to uid {uid} (run lw-sandbox as root, or set sandbox.uid to your uid); chown"),
                &self.mount,
                e,
            )
        })?;
        fs::set_permissions(&self.mount, fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io("cannot set the mode of", &self.mount, e))
    }

    /// Unmounts (lazily when still busy) and removes the image and the
    /// mount point, with what a plain directory there holds.  What was on
    /// it must have been saved before.
    pub fn remove(&self) -> Result<bool> {
        let had = self.image.exists() || is_mounted(&self.mount);
        if is_mounted(&self.mount)
            && run(Command::new("umount").arg(&self.mount), "umount").is_err()
        {
            run(
                Command::new("umount").arg("-l").arg(&self.mount),
                "umount -l",
            )
            .map_err(|w| {
                Error::new(
                    Exit::IoErr,
                    format!("cannot unmount '{}': {w}", self.mount.display()),
                )
            })?;
        }
        // Unmounted now (a lazy unmount detaches at once): what is left is
        // the host's own directory, whose inside the sandbox may have
        // written (sandbox.disk = off): removed through descriptors.
        if !is_mounted(&self.mount) {
            match base::fs::remove_tree(&self.mount) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("cannot remove", &self.mount, e)),
            }
        }
        match fs::remove_file(&self.image) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("cannot remove", &self.image, e)),
        }
        Ok(had)
    }
}

/// Names with a disk image or a gVisor scratch mount (scratch.rs) under
/// the root (for gc).
pub fn names(root: &Root) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(disk_dir(root))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".work.img")
                .or_else(|| n.strip_suffix(".mail.img"))
                .or_else(|| n.strip_suffix(".scratch"))
                .map(str::to_string)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}
