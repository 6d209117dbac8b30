//! Resolving a path that a sandbox can write, as root, without being steered.
//!
//! A sandbox owns the inside of its mail dir (and its workspace): it can
//! replace any directory it may write with a symbolic link to anywhere on
//! the host.  The host-side code that reads or cleans those trees runs as
//! root, so a path there is never handed to a path-based call: it is
//! resolved beneath a directory descriptor the caller opened from a place
//! the sandbox cannot touch (the mailbox root), and a symbolic link at
//! *any* component refuses the whole resolution with `ELOOP`, as `..` and
//! an absolute path do (`EXDEV`/`EINVAL`).
//!
//! One openat2(2) call with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS` does it on Linux 5.6 and later.  Where openat2 is
//! missing (`ENOSYS`: older kernels, gVisor's sentry; `EPERM`: a seccomp
//! profile that does not know it), a walk one component at a time with
//! `O_NOFOLLOW | O_DIRECTORY` gives the same answer: a link in the middle
//! fails `O_DIRECTORY|O_NOFOLLOW` (`ELOOP` or `ENOTDIR`), a link at the end
//! fails `O_NOFOLLOW`.
//!
//! [`remove_tree_at`] removes a directory tree through descriptors only, so
//! a link planted anywhere in it is removed, never followed.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

const DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::CLOEXEC)
    .union(OFlags::NOFOLLOW);

/// Opens `rel` beneath the directory `base` with `flags` (plus `O_CLOEXEC`
/// and `O_NOFOLLOW`), refusing a symbolic link at every component, `..`
/// and absolute paths.  An empty `rel` (or `.`) opens `base` itself again.
pub fn open_beneath(base: impl AsFd, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    // `..` is refused even where it stays beneath: no caller needs it,
    // and both paths then give the same answer.
    if rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Errno::XDEV);
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rfs::openat2(&base, rel, flags, Mode::empty(), resolve) {
        Err(Errno::NOSYS) | Err(Errno::PERM) => walk(base, rel, flags),
        r => r,
    }
}

/// [`open_beneath`] for a directory.
pub fn open_dir_beneath(base: impl AsFd, rel: &Path) -> rustix::io::Result<OwnedFd> {
    open_beneath(base, rel, DIR)
}

/// Opens the directory at `path` (absolute, or relative to the working
/// directory) refusing a symbolic link at every component: for a path
/// that a sandbox's tree may hold but no trusted descriptor names yet.
pub fn open_dir_no_links(path: &Path) -> rustix::io::Result<OwnedFd> {
    if path.is_absolute() {
        let top = rfs::open("/", DIR, Mode::empty())?;
        let rel = path
            .strip_prefix("/")
            .expect("an absolute path starts at /");
        open_dir_beneath(&top, rel)
    } else {
        open_dir_beneath(rfs::CWD, path)
    }
}

/// The fallback of [`open_beneath`]: one component at a time.
fn walk(base: impl AsFd, rel: &Path, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let comps: Vec<&OsStr> = rel
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            Component::ParentDir => Err(Errno::XDEV),
            _ => Err(Errno::INVAL),
        })
        .collect::<rustix::io::Result<_>>()?;
    let Some((last, dirs)) = comps.split_last() else {
        return rfs::openat(&base, ".", flags, Mode::empty());
    };
    let mut cur: Option<OwnedFd> = None;
    for d in dirs {
        let next = match &cur {
            Some(fd) => rfs::openat(fd, *d, DIR, Mode::empty())?,
            None => rfs::openat(&base, *d, DIR, Mode::empty())?,
        };
        cur = Some(next);
    }
    match &cur {
        Some(fd) => rfs::openat(fd, *last, flags, Mode::empty()),
        None => rfs::openat(&base, *last, flags, Mode::empty()),
    }
}

/// Removes `name` in the directory `dir` with everything below it, through
/// descriptors only: a symbolic link anywhere in the tree is removed as a
/// link, never followed, and nothing outside the tree is touched.  A
/// missing `name` is no error.  Depth is bounded (a sandbox can nest
/// directories as deep as its quota allows): past 256 levels it fails with
/// `ELOOP` and leaves what it could not reach.
pub fn remove_tree_at(dir: impl AsFd, name: &OsStr) -> rustix::io::Result<()> {
    remove_tree_depth(dir.as_fd(), name, 256)
}

/// [`remove_tree_at`] of the last component of `path`, whose parent is a
/// directory the sandbox cannot write (opened by path: the caller trusts
/// it), for a directory whose inside a sandbox owned.
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let pfd = match rfs::open(parent, DIR.difference(OFlags::NOFOLLOW), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    remove_tree_at(&pfd, name).map_err(Into::into)
}

fn remove_tree_depth(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &OsStr,
    depth: u32,
) -> rustix::io::Result<()> {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
        Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::Directory => {
            return match rfs::unlinkat(dir, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e),
            };
        }
        Ok(_) => {}
    }
    if depth == 0 {
        return Err(Errno::LOOP);
    }
    let sub = match rfs::openat(dir, name, DIR, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for ent in rfs::Dir::read_from(&sub)? {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(std::ffi::OsString::from(
                <OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(n),
            ));
        }
    }
    for n in names {
        remove_tree_depth(sub.as_fd(), &n, depth - 1)?;
    }
    match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (std::path::PathBuf, OwnedFd) {
        let d = std::env::temp_dir().join(format!(
            "lw-beneath-{}-{:x}",
            std::process::id(),
            crate::id::random128() as u32
        ));
        std::fs::create_dir_all(d.join("box/outbox/tmp")).unwrap();
        std::fs::create_dir_all(d.join("host/tmp")).unwrap();
        std::fs::write(d.join("host/tmp/canary"), b"host").unwrap();
        let fd = rfs::open(&d, DIR, Mode::empty()).unwrap();
        (d, fd)
    }

    /// Both the openat2 path and the walk give the same answers.
    fn opens(fd: &OwnedFd, rel: &str) -> Vec<rustix::io::Result<()>> {
        vec![
            open_dir_beneath(fd, Path::new(rel)).map(drop),
            walk(fd, Path::new(rel), DIR).map(drop),
        ]
    }

    #[test]
    fn a_link_at_any_component_is_refused_by_both_paths() {
        let (d, fd) = tree();
        assert!(opens(&fd, "box/outbox/tmp").iter().all(|r| r.is_ok()));
        assert!(opens(&fd, "").iter().all(|r| r.is_ok()));
        // A link in the middle, at the end, and to a host directory.
        symlink(d.join("host"), d.join("box/inbox")).unwrap();
        symlink("/", d.join("box/outbox/new")).unwrap();
        for rel in [
            "box/inbox/tmp",
            "box/inbox",
            "box/outbox/new",
            "box/outbox/new/tmp",
        ] {
            for r in opens(&fd, rel) {
                assert!(
                    matches!(r, Err(Errno::LOOP) | Err(Errno::NOTDIR)),
                    "{rel}: {r:?}"
                );
            }
        }
        // `..` and absolute paths never leave the base.
        for rel in ["box/../host/tmp", "/tmp", "box/../../"] {
            for r in opens(&fd, rel) {
                assert!(r.is_err(), "{rel}: {r:?}");
            }
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn no_links_refuses_a_link_in_an_absolute_path() {
        let (d, _fd) = tree();
        assert!(open_dir_no_links(&d.join("box/outbox/tmp")).is_ok());
        symlink(d.join("host"), d.join("box/inbox")).unwrap();
        assert_eq!(
            open_dir_no_links(&d.join("box/inbox/tmp")).err(),
            Some(Errno::LOOP)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn remove_tree_removes_links_and_never_follows_them() {
        let (d, fd) = tree();
        std::fs::create_dir_all(d.join("box/outbox/new/deep/er")).unwrap();
        std::fs::write(d.join("box/outbox/new/deep/er/f"), b"x").unwrap();
        symlink(d.join("host"), d.join("box/outbox/new/deep/host")).unwrap();
        symlink(d.join("host/tmp/canary"), d.join("box/outbox/canary")).unwrap();
        let boxfd = open_dir_beneath(&fd, Path::new("box")).unwrap();
        remove_tree_at(&boxfd, OsStr::new("outbox")).unwrap();
        assert!(!d.join("box/outbox").exists());
        assert_eq!(std::fs::read(d.join("host/tmp/canary")).unwrap(), b"host");
        // Missing is no error.
        remove_tree_at(&boxfd, OsStr::new("outbox")).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
