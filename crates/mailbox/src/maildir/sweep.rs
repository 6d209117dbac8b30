//! Cleaning `tmp/`: what a writer killed mid-delivery left there, removed
//! once older than [`TMP_MAX_AGE`] (mailbox-spec.md, "Delivery").

use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use rustix::fs as rfs;
use rustix::io::Errno;

use base::error::errno_io;

/// How old a file in `tmp/` must be before [`sweep_tmp`] removes it: a
/// writer killed mid-delivery leaves one there, and nobody reads `tmp/`
/// (mailbox-spec.md, "Delivery"; the same 36 hours as Maildir).
pub const TMP_MAX_AGE: Duration = Duration::from_secs(36 * 3600);

/// Removes the plain files in `M/tmp/` last modified longer ago than
/// `max_age`, where `maildir` is `M`'s path beneath the directory `base`;
/// returns how many.  Nothing else is touched: a directory, a link or a
/// FIFO planted in `tmp/` stays (it is reported elsewhere), a symbolic link
/// at any component of `M/tmp` (a sandbox owns what is inside its mail
/// dir and may replace `outbox` or `outbox/tmp` with a link to a host
/// directory) means there is nothing to sweep, and a missing `tmp/` is no
/// error.
pub fn sweep_tmp(base: impl AsFd, maildir: &Path, max_age: Duration) -> io::Result<usize> {
    let dir = match base::fs::open_dir_beneath(base, &maildir.join("tmp")) {
        Ok(d) => d,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => return Ok(0),
        Err(e) => return Err(errno_io(e)),
    };
    let now = base::time::now();
    let mut removed = 0;
    for ent in rfs::Dir::read_from(&dir).map_err(errno_io)? {
        let ent = ent.map_err(errno_io)?;
        let name = ent.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let Ok(st) = rfs::statat(&dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
            continue;
        }
        let changed = Duration::from_secs(st.st_mtime.max(0) as u64);
        if now.saturating_sub(changed) > max_age
            && rfs::unlinkat(&dir, name, rfs::AtFlags::empty()).is_ok()
        {
            removed += 1;
        }
    }
    Ok(removed)
}
