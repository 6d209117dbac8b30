//! Taking a bad file out of a sandbox's outbox into the root's quarantine.
//!
//! A regular file with one link is renamed, whole, and its mode cut to
//! 0600 or less (no setuid, setgid or execute bit survives).  One with more
//! links is copied instead, since a rename would leave the sender a link
//! through which to write the kept file: the copy is a new inode (mode 0600,
//! the mediator's), of at most [`KEEP`] bytes.  So is a file on another
//! filesystem — a sandbox's mail dir is one of its own
//! (lib/sandbox/disk.rs), which is also why nothing there can be linked from
//! elsewhere.  A symbolic link is made again, unfollowed.  A
//! FIFO or socket leaves a note in its place.  The source goes once its
//! replacement is durable.  A directory is renamed when it can be and left
//! where it is when it cannot (another filesystem).

use std::ffi::OsStr;
use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The most of a bad file the quarantine keeps.
pub const KEEP: u64 = 16 << 20;

/// Takes `name` from `from_dir` into `to_dir` as `to_name`.  Ok(false) when
/// the source is gone (taken already).
pub fn take(
    from_dir: &OwnedFd,
    name: &OsStr,
    to_dir: &OwnedFd,
    to_name: &OsStr,
) -> rustix::io::Result<bool> {
    let st = match rfs::statat(from_dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            if st.st_nlink == 1 {
                match crate::fs::rename_noreplace_at(from_dir, name, to_dir, to_name) {
                    Ok(()) => {
                        let mode = Mode::from_raw_mode(st.st_mode & 0o600);
                        rfs::chmodat(to_dir, to_name, mode, AtFlags::empty())?;
                        return Ok(true);
                    }
                    Err(Errno::NOENT) => return Ok(false),
                    Err(Errno::XDEV) => {}
                    Err(e) => return Err(e),
                }
            }
            let src = rfs::openat(
                from_dir,
                name,
                OFlags::RDONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::CLOEXEC
                    | OFlags::NOCTTY,
                Mode::empty(),
            )?;
            let dst = create(to_dir, to_name)?;
            let mut left = KEEP;
            let mut buf = vec![0u8; 64 * 1024];
            while left > 0 {
                let want = buf.len().min(left as usize);
                let n = rustix::io::read(&src, &mut buf[..want])?;
                if n == 0 {
                    break;
                }
                write_all(&dst, &buf[..n])?;
                left -= n as u64;
            }
            rfs::fsync(&dst)?;
        }
        FileType::Symlink => {
            let target = rfs::readlinkat(from_dir, name, Vec::new())?;
            rfs::symlinkat(target.as_c_str(), to_dir, to_name)?;
        }
        FileType::Directory => {
            return match rfs::renameat_with(
                from_dir,
                name,
                to_dir,
                to_name,
                rfs::RenameFlags::NOREPLACE,
            ) {
                Ok(()) => Ok(true),
                Err(Errno::NOENT) => Ok(false),
                Err(e) => Err(e),
            };
        }
        _ => {
            let dst = create(to_dir, to_name)?;
            write_all(
                &dst,
                b"not a regular file (a FIFO, socket or device): not kept\n",
            )?;
            rfs::fsync(&dst)?;
        }
    }
    match rfs::unlinkat(from_dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e),
    }
}

fn create(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rfs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
}

fn write_all(fd: &OwnedFd, mut b: &[u8]) -> rustix::io::Result<()> {
    while !b.is_empty() {
        let n = rustix::io::write(fd, b)?;
        b = &b[n..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    /// A scratch directory with `out/bad`, a setuid file, and an empty `q/`.
    fn planted(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("{tag}-{}", crate::id::new_id()));
        std::fs::create_dir_all(d.join("out")).unwrap();
        std::fs::create_dir_all(d.join("q")).unwrap();
        std::fs::write(d.join("out/bad"), b"junk").unwrap();
        std::fs::set_permissions(d.join("out/bad"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        d
    }

    fn dir(d: &std::path::Path, name: &str) -> OwnedFd {
        rfs::open(
            d.join(name),
            OFlags::DIRECTORY | OFlags::RDONLY,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_single_link_is_renamed_whole_without_its_setuid_bit() {
        let d = planted("lw-quarantine1");
        let ino = std::fs::metadata(d.join("out/bad")).unwrap().ino();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        assert!(take(&from, OsStr::new("bad"), &to, OsStr::new("Q1")).unwrap());
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        assert_eq!((m.ino(), m.mode() & 0o7777), (ino, 0o600));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_hard_link_kept_by_the_sender_cannot_write_the_quarantined_copy() {
        let d = planted("lw-quarantine");
        std::fs::hard_link(d.join("out/bad"), d.join("keep")).unwrap();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        assert!(take(&from, OsStr::new("bad"), &to, OsStr::new("Q1")).unwrap());
        assert!(!take(&from, OsStr::new("bad"), &to, OsStr::new("Q1")).unwrap());
        std::fs::write(d.join("keep"), b"changed through the link").unwrap();
        assert_eq!(std::fs::read(d.join("q/Q1")).unwrap(), b"junk");
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        assert_eq!((m.mode() & 0o7777, m.nlink()), (0o600, 1));
        assert!(!d.join("out/bad").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
