//! Looking at an outbox entry before trusting it: what kind of file it is,
//! whether it may be opened, and the stable id of its quarantine entry.

use crate::message::{self, Message};
use base::error::errno_io;
use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use super::pure::decide::derived_id;

/// What an outbox entry turned out to be.
pub(super) enum Inspected {
    Message(Message),
    Bad(String, rfs::Stat),
    Gone,
}

/// Examines `name` in the directory `dir` without following it, blocking on
/// it, or reading more than the size limit.  `twin` is the `tmp/` of the
/// same Maildir, where a post still being moved has its other name (see
/// [`settle_twin`]); None for the door's own queues.
pub(super) fn inspect(dir: &OwnedFd, name: &OsStr, own: bool, twin: Option<&OwnedFd>) -> Inspected {
    let mut st = match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(_) => return Inspected::Gone,
    };
    if let (2, Some(tmp)) = (st.st_nlink, twin)
        && rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile
    {
        match settle_twin(dir, tmp, name, &st) {
            Some(Some(now)) => st = now,
            Some(None) => return Inspected::Gone,
            None => {}
        }
    }
    let bad = |why: String| Inspected::Bad(why, st);
    let ft = rfs::FileType::from_raw_mode(st.st_mode);
    if ft != rfs::FileType::RegularFile {
        let what = match ft {
            rfs::FileType::Directory => "a directory",
            rfs::FileType::Symlink => "a symbolic link (not followed)",
            rfs::FileType::Fifo => "a FIFO (not opened)",
            rfs::FileType::Socket => "a socket",
            _ => "a device",
        };
        return bad(format!("{what}, not a message file"));
    }
    let Ok(text) = std::str::from_utf8(name.as_bytes()) else {
        return bad("file name is not UTF-8".into());
    };
    if !base::id::is_valid(text) {
        return bad("file name does not follow the id grammar".into());
    }
    if st.st_nlink > 1 {
        return bad(format!(
            "{} hard links; a posted message has one (not read)",
            st.st_nlink
        ));
    }
    if st.st_mode & 0o7111 != 0 {
        return bad(format!(
            "mode {:o} has setuid, setgid, sticky or execute bits; a posted message has none (not read)",
            st.st_mode & 0o7777
        ));
    }
    if st.st_size as u64 > message::MAX_FILE {
        return bad(format!(
            "file is {} bytes; the limit is {} (not read)",
            st.st_size,
            message::MAX_FILE
        ));
    }
    let fd = match rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Inspected::Gone,
        Err(e) => return bad(format!("cannot open: {}", errno_io(e))),
    };
    // The entry may have been swapped between the stat and the open.
    match rfs::fstat(&fd) {
        Ok(st2) if st2.st_ino == st.st_ino && st2.st_dev == st.st_dev && st2.st_nlink == 1 => {}
        Ok(_) => return bad("changed while being read".into()),
        Err(e) => return bad(format!("cannot stat: {}", errno_io(e))),
    }
    let mut buf = Vec::with_capacity(st.st_size as usize);
    if let Err(e) = std::fs::File::from(fd)
        .take(message::MAX_FILE + 1)
        .read_to_end(&mut buf)
    {
        return bad(format!("cannot read: {e}"));
    }
    match Message::parse(&buf) {
        Ok(m) if m.id != text => bad(format!("id '{}' inside does not match the file name", m.id)),
        Ok(m) if !own && !m.kind.postable() => bad(format!(
            "kind '{}' is the mediator's own and cannot be posted",
            m.kind
        )),
        Ok(m) => Inspected::Message(m),
        Err(e) => bad(e.0),
    }
}

/// Finishes a post caught between the two steps of a move by `link` and
/// `unlink` (fs/atomic.rs: where the file system refuses
/// `RENAME_NOREPLACE`, as gVisor's does): the file `name` in `new/` has two
/// links, the other being `tmp/NAME` of the same Maildir, the same inode.
/// The mediator removes that tmp name itself (beneath the directory's
/// descriptor; lw-post takes ENOENT on its own unlink as done) and looks
/// again: Some(Some(stat)) of the same inode, now with the links it has
/// (one, unless the sandbox made another meanwhile, which is quarantined);
/// Some(None) when the entry is gone.  None when the other link is not
/// such a twin: a planted link stays what it is.
fn settle_twin(
    new: &OwnedFd,
    tmp: &OwnedFd,
    name: &OsStr,
    st: &rfs::Stat,
) -> Option<Option<rfs::Stat>> {
    let same = |s: &rfs::Stat| (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino);
    match rfs::statat(tmp, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(t) if same(&t) => match rfs::unlinkat(tmp, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(_) => return None,
        },
        // lw-post removed its tmp name meanwhile: the move is done.
        Err(Errno::NOENT) => {}
        _ => return None,
    }
    match rfs::statat(new, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(now) if same(&now) => Some(Some(now)),
        Ok(_) => None,
        Err(_) => Some(None),
    }
}

/// The quarantine id of a bad entry: stable across restarts for the same file.
pub(super) fn quarantine_id(sender: &str, name: &OsStr, st: &rfs::Stat) -> String {
    let t = Duration::new(
        st.st_ctime.max(0) as u64,
        st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
    );
    derived_id(
        t,
        &[
            b"quarantine",
            sender.as_bytes(),
            name.as_bytes(),
            &st.st_dev.to_le_bytes(),
            &st.st_ino.to_le_bytes(),
            &st.st_ctime.to_le_bytes(),
            &st.st_ctime_nsec.to_le_bytes(),
        ],
    )
}
