//! No-replace renames and atomic whole-file replacement.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

use rustix::fs::{self as rfs, AtFlags, RenameFlags};
use rustix::io::Errno;

/// Moves `from` (in `from_dir`) to `to` (in `to_dir`) unless `to` exists,
/// which fails with `EEXIST` and leaves both in place.
///
/// `renameat2(RENAME_NOREPLACE)` does it in one step.  Where the filesystem
/// answers `EINVAL` (it does not support the flag) or the kernel `ENOSYS`,
/// the same guarantee comes from `linkat` (which never replaces) followed by
/// `unlinkat` of the source.  Between the two steps the file has two names
/// and a link count of 2; a reader never sees a partial file either way.
/// The mediator recognises such an in-flight twin in an outbox (the same
/// inode at `tmp/NAME`) and finishes the move itself (mediate/inspect.rs),
/// which is why `ENOENT` from the unlink counts as done.
pub fn rename_noreplace_at(
    from_dir: impl AsFd,
    from: &OsStr,
    to_dir: impl AsFd,
    to: &OsStr,
) -> rustix::io::Result<()> {
    match rfs::renameat_with(&from_dir, from, &to_dir, to, RenameFlags::NOREPLACE) {
        Err(Errno::INVAL) | Err(Errno::NOSYS) => {
            rfs::linkat(&from_dir, from, &to_dir, to, AtFlags::empty())?;
            match rfs::unlinkat(&from_dir, from, AtFlags::empty()) {
                // Someone removed the old name meanwhile: the move happened.
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e),
            }
        }
        r => r,
    }
}

/// Whether [`write_replace`] makes the new content durable before returning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync the file before the rename and the directory after it.
    Synced,
    /// Only atomic: a crash may leave the old content (for caches whose loss
    /// costs only repeated work).
    Unsynced,
}

/// Replaces `path` with `bytes`, atomically: readers see the old content or
/// the new, never a mix, and with [`Durability::Synced`] the new content
/// survives a crash once this returns.  The file gets exactly `mode`.
pub fn write_replace(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    write_replace_with(path, mode, durability, |f| f.write_all(bytes))
}

/// [`write_replace`] for content written by `fill` (a stream, say): `fill`
/// writes into a new temporary file beside `path`, which replaces `path`
/// only when `fill` succeeded (then fsynced first with
/// [`Durability::Synced`]).  On any failure the temporary file is removed
/// and `path` is untouched.  Returns what `fill` returned.
pub fn write_replace_with<T, E: From<io::Error>>(
    path: &Path,
    mode: u32,
    durability: Durability,
    fill: impl FnOnce(&mut File) -> Result<T, E>,
) -> Result<T, E> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.{:032x}.tmp",
        name.to_string_lossy(),
        crate::id::random128()
    ));
    let res = (|| -> Result<T, E> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&tmp)?;
        // Exactly `mode`, whatever the umask: callers name the mode they mean.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        let made = fill(&mut f)?;
        if durability == Durability::Synced {
            f.sync_all()?;
        }
        drop(f);
        std::fs::rename(&tmp, path)?;
        Ok(made)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return res;
    }
    if durability == Durability::Synced {
        sync_dir(dir)?;
    }
    res
}

/// fsyncs a directory, so the names created, renamed or removed in it last.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("lw-fs-{}", crate::id::new_id()));
        std::fs::create_dir_all(&d).expect("temp dir is writable");
        d
    }

    #[test]
    fn replace_writes_whole_files_and_leaves_no_temporary() {
        let d = tempdir();
        let p = d.join("state.json");
        write_replace(&p, b"one", 0o600, Durability::Synced).expect("first write");
        write_replace(&p, b"two", 0o600, Durability::Unsynced).expect("second write");
        assert_eq!(std::fs::read(&p).expect("read back"), b"two");
        let names: Vec<_> = std::fs::read_dir(&d).expect("list").collect();
        assert_eq!(names.len(), 1, "a temporary file was left behind");
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn replace_never_writes_through_a_planted_symlink() {
        let d = tempdir();
        let p = d.join("f");
        std::fs::write(d.join("victim"), b"keep").expect("victim");
        write_replace(&p, b"x", 0o644, Durability::Synced).expect("write");
        assert_eq!(std::fs::read(d.join("victim")).expect("victim"), b"keep");
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn noreplace_refuses_an_existing_target() {
        let d = tempdir();
        std::fs::write(d.join("a"), b"a").expect("a");
        std::fs::write(d.join("b"), b"b").expect("b");
        let dir = File::open(&d).expect("dir");
        let e = rename_noreplace_at(&dir, OsStr::new("a"), &dir, OsStr::new("b"));
        assert_eq!(e, Err(Errno::EXIST));
        assert_eq!(std::fs::read(d.join("b")).expect("b"), b"b");
        rename_noreplace_at(&dir, OsStr::new("a"), &dir, OsStr::new("c")).expect("move");
        assert!(!d.join("a").exists() && d.join("c").exists());
        std::fs::remove_dir_all(d).ok();
    }

    #[test]
    fn a_failed_fill_leaves_the_old_file_and_no_temporary() {
        let d = tempdir();
        let p = d.join("archive");
        write_replace(&p, b"old", 0o644, Durability::Synced).expect("first write");
        let e = write_replace_with(&p, 0o644, Durability::Synced, |f| {
            f.write_all(b"half of the new")?;
            Err::<(), io::Error>(io::Error::other("the stream broke"))
        });
        assert_eq!(
            e.expect_err("the fill failed").to_string(),
            "the stream broke"
        );
        assert_eq!(std::fs::read(&p).expect("read back"), b"old");
        let n = write_replace_with(&p, 0o600, Durability::Synced, |f| {
            f.write_all(b"new").map(|()| 3)
        })
        .expect("second write");
        assert_eq!(
            (n, std::fs::read(&p).expect("read back")),
            (3, b"new".to_vec())
        );
        let names: Vec<_> = std::fs::read_dir(&d).expect("list").collect();
        assert_eq!(names.len(), 1, "a temporary file was left behind");
        std::fs::remove_dir_all(d).ok();
    }
}
