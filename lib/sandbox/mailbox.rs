//! A sandbox's mail dir: how it is given to the sandbox, and when the
//! sandbox goes, what counts as unread and where it is kept.
//!
//! Given ([`give`]): the mail dir's top and its `inbox/` and `outbox/`
//! stay root's, mode 0711, so the sandbox passes through them but cannot
//! rename, remove or replace them (with a link to a host directory, say);
//! only the six Maildir directories below (`tmp/`, `new/`, `cur/` of each)
//! are its user's, mode 0700, which is all lw-post and lw-inbox need.
//!
//! Only a valid message counts as unread: a regular, singly linked file
//! without setuid, setgid, sticky or execute bits, within the size limit,
//! named by the id grammar, that parses as a message with that id (the
//! checks the mediator makes of an outbox entry).  Anything else in `new/`
//! is junk a sandbox planted; it never keeps a mail dir alive.
//!
//! `rm` and `gc` remove a mail dir whole.  Before that, what it still
//! holds is copied to `ROOT/archive/NAME.STAMP/` (mode 0700): unread
//! messages under `unread/inbox/` and `unread/outbox/`, junk under
//! `quarantine/` with one line per file in `quarantine/REASONS`.  Copies,
//! never renames: the mail dir is another filesystem (lib/sandbox/disk.rs),
//! and a copy shares no inode the sandbox could still write through.  The
//! junk kept is bounded as the mediator's quarantine is (crates/mailbox's
//! quarantine.rs): at most [`JUNK_MAX`] bytes of it (each file charged its
//! kept length in 4 KiB blocks), the first 1 MiB of a file at most, a
//! block of zeros left a hole; past that a file is listed in `REASONS`, not
//! kept.
//!
//! This runs as root over a tree the sandbox owns, so nothing here is
//! opened by path: the mail dir is opened beneath the root's descriptor
//! and every directory and file beneath it with crates/base/src/fs's `open_beneath`
//! (a symbolic link at any component refused), each entry checked with
//! fstat(2) on the descriptor it was read from.  A `new/` (or `inbox`,
//! `outbox`) replaced by a link is reported as junk, not followed.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use base::error::{Error, Result, errno_io};
use base::visible::visible_line;
use mailbox::layout::Root;
use mailbox::message::{self, Message};

/// The most of a sandbox's junk the archive keeps: the default quarantine
/// budget (`door.quarantine-max`, lw-mediate(1)).
pub const JUNK_MAX: u64 = mailbox::mediate::DEFAULT_QUARANTINE_MAX;
/// The unit junk is charged in.
const BLOCK: u64 = mailbox::quarantine::BLOCK;

/// The entry `name` of the directory `dir` as a valid message (with its
/// bytes), or why it is not one (with its bytes when it was a regular
/// file that could be read).
fn check_at(
    dir: &OwnedFd,
    name: &OsStr,
) -> (std::result::Result<Message, String>, Option<Vec<u8>>) {
    // Only a regular file is opened (a device or FIFO never is); the
    // descriptor's own fstat below is what counts.
    match rfs::statat(dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::RegularFile => {}
        Ok(_) => return (Err("not a regular file".into()), None),
        Err(e) => return (Err(format!("cannot stat: {}", errno_io(e))), None),
    }
    let f = match rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(f) => f,
        Err(Errno::LOOP) => return (Err("a symbolic link; not followed".into()), None),
        Err(e) => return (Err(format!("cannot open: {}", errno_io(e))), None),
    };
    let st = match rfs::fstat(&f) {
        Ok(st) => st,
        Err(e) => return (Err(format!("cannot stat: {}", errno_io(e))), None),
    };
    if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
        return (Err("not a regular file".into()), None);
    }
    let mut buf = Vec::new();
    let read = std::fs::File::from(f)
        .take(message::MAX_FILE)
        .read_to_end(&mut buf);
    if let Err(e) = read {
        return (Err(format!("cannot read: {e}")), None);
    }
    let why = if st.st_nlink > 1 {
        Some(format!("{} hard links; a message has one", st.st_nlink))
    } else if st.st_mode & 0o7111 != 0 {
        Some(format!(
            "mode {:o} has setuid, setgid, sticky or execute bits",
            st.st_mode & 0o7777
        ))
    } else if st.st_size as u64 > message::MAX_FILE {
        Some(format!(
            "{} bytes; the limit is {}",
            st.st_size,
            message::MAX_FILE
        ))
    } else {
        None
    };
    if let Some(why) = why {
        return (Err(why), Some(buf));
    }
    let Some(name) = name.to_str().filter(|n| base::id::is_valid(n)) else {
        return (
            Err("file name does not follow the id grammar".into()),
            Some(buf),
        );
    };
    match Message::parse(&buf) {
        Ok(m) if m.id == name => (Ok(m), Some(buf)),
        Ok(m) => (
            Err(format!("id '{}' inside does not match the file name", m.id)),
            Some(buf),
        ),
        Err(e) => (Err(e.0), Some(buf)),
    }
}

/// What `new/` of a mail dir's inbox and outbox holds.
#[derive(Debug, Default)]
pub struct Unread {
    /// (`inbox` or `outbox`, file name, content) of each valid message.
    pub messages: Vec<(&'static str, OsString, Vec<u8>)>,
    /// (path inside the mail dir, reason, content when it was a regular
    /// file kept within [`JUNK_MAX`], else why not) of everything else.
    pub junk: Vec<(String, String, std::result::Result<Vec<u8>, String>)>,
}

/// Reads `new/` of sandbox `name`'s inbox and outbox beneath the root, never
/// following a link (see the module docs).  A mail dir that is missing
/// holds nothing.
pub fn unread(root: &Root, name: &str) -> Result<Unread> {
    let mut u = Unread::default();
    let mut left = JUNK_MAX;
    let dir = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let rootfd = rfs::open(&root.dir, dir, Mode::empty()); // trusted: the root, no sandbox's
    let rootfd = rootfd.map_err(|e| Error::io("cannot open", &root.dir, errno_io(e)))?;
    let boxdir = Path::new("sandboxes").join(name);
    let boxfd = match base::fs::open_dir_beneath(&rootfd, &boxdir) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(u),
        Err(e) => {
            return Err(Error::io(
                "cannot open",
                &root.dir.join(&boxdir),
                errno_io(e),
            ));
        }
    };
    for which in ["inbox", "outbox"] {
        let rel = Path::new(which).join("new");
        let dir = match base::fs::open_dir_beneath(&boxfd, &rel) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
                u.junk.push((
                    rel.display().to_string(),
                    format!(
                        "{} or a directory above it is a symbolic link or not a directory; not followed ({})",
                        rel.display(),
                        errno_io(e)
                    ),
                    Err("not a regular file".into()),
                ));
                continue;
            }
            Err(e) => {
                return Err(Error::io(
                    "cannot open",
                    &root.dir.join(&boxdir).join(&rel),
                    errno_io(e),
                ));
            }
        };
        let mut names: Vec<OsString> = Vec::new();
        for ent in rfs::Dir::read_from(&dir).map_err(|e| {
            Error::io(
                "cannot read",
                &root.dir.join(&boxdir).join(&rel),
                errno_io(e),
            )
        })? {
            let Ok(ent) = ent else { break };
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(OsStr::from_bytes(n).to_os_string());
            }
        }
        names.sort();
        for n in names {
            match check_at(&dir, &n) {
                (Ok(_), Some(bytes)) => u.messages.push((which, n, bytes)),
                (Ok(_), None) => unreachable!("a valid message was read"),
                (Err(why), bytes) => {
                    let kept = match bytes {
                        None => Err("not a regular file".to_string()),
                        Some(b) => {
                            let cost = (b.len() as u64).div_ceil(BLOCK).max(1) * BLOCK;
                            if cost <= left {
                                left -= cost;
                                Ok(b)
                            } else {
                                Err(format!(
                                    "past the {} MiB the archive keeps of a sandbox's junk",
                                    JUNK_MAX >> 20
                                ))
                            }
                        }
                    };
                    u.junk.push((
                        format!("{}/{}", rel.display(), n.to_string_lossy()),
                        why,
                        kept,
                    ))
                }
            }
        }
    }
    Ok(u)
}

/// Gives the mail dir at `boxdir` (below `ROOT/sandboxes`, made by the
/// registry) to the sandbox's user `uid` as the module docs say, through
/// descriptors opened without following a link.
pub fn give(boxdir: &Path, uid: u32) -> Result<()> {
    let no_perm = |what: &str, p: &Path, e: Errno| {
        Error::io_as(
            base::error::Exit::NoPerm,
            &format!(
                "cannot give the mailbox to uid {uid} (run lw-sandbox as root, or set sandbox.uid to your uid); {what}"
            ),
            p,
            errno_io(e),
        )
    };
    let top = base::fs::open_dir_no_links(boxdir).map_err(|e| no_perm("open", boxdir, e))?;
    let set = |fd: &OwnedFd, p: &Path, owner: u32, mode: u32| -> Result<()> {
        rfs::fchown(
            fd,
            Some(rfs::Uid::from_raw(owner)),
            Some(rfs::Gid::from_raw(owner)),
        )
        .map_err(|e| no_perm("chown", p, e))?;
        rfs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(|e| no_perm("chmod", p, e))
    };
    set(&top, boxdir, 0, 0o711)?;
    for which in ["inbox", "outbox"] {
        let p = boxdir.join(which);
        let fd = base::fs::open_dir_beneath(&top, Path::new(which))
            .map_err(|e| no_perm("open", &p, e))?;
        set(&fd, &p, 0, 0o711)?;
        for sub in ["tmp", "new", "cur"] {
            let p = p.join(sub);
            let leaf = base::fs::open_dir_beneath(&fd, Path::new(sub))
                .map_err(|e| no_perm("open", &p, e))?;
            set(&leaf, &p, uid, 0o700)?;
        }
    }
    Ok(())
}

fn mkdir_private(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| Error::io("cannot create", p, e))?; // trusted: ROOT/archive
    fs::set_permissions(p, fs::Permissions::from_mode(0o700)) // trusted: ROOT/archive
        .map_err(|e| Error::io("cannot set the mode of", p, e))
}

/// Writes `bytes` into a new file `to` (mode 0600) in the root's archive,
/// a block of zeros left a hole.
fn write_new(to: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt as _;
    let f = fs::File::options() // trusted: ROOT/archive
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| Error::io("cannot create", to, e))?;
    let mut off = 0u64;
    let mut write = || -> std::io::Result<()> {
        for block in bytes.chunks(BLOCK as usize) {
            if block.iter().any(|b| *b != 0) {
                f.write_all_at(block, off)?;
            }
            off += block.len() as u64;
        }
        f.set_len(off)?;
        f.sync_all()
    };
    write().map_err(|e| Error::io("cannot write", to, e))
}

/// Copies what sandbox `name`'s mail dir still holds to the root's
/// archive; returns the archive directory and the number of unread
/// messages, or None when there was nothing to keep.
pub fn archive(root: &Root, name: &str) -> Result<Option<(PathBuf, usize)>> {
    let u = unread(root, name)?;
    if u.messages.is_empty() && u.junk.is_empty() {
        return Ok(None);
    }
    let stamp = base::time::rfc3339(base::time::now()).replace(':', "");
    let dir = root.dir.join("archive").join(format!(
        "{name}.{stamp}.{:08x}",
        base::id::random128() as u32
    ));
    mkdir_private(&root.dir.join("archive"))?;
    mkdir_private(&dir)?;
    for (which, n, bytes) in &u.messages {
        let to_dir = dir.join("unread").join(which);
        mkdir_private(&to_dir)?;
        write_new(&to_dir.join(n), bytes)?;
    }
    if !u.junk.is_empty() {
        let q = dir.join("quarantine");
        mkdir_private(&q)?;
        let mut reasons = String::new();
        for (i, (shown, why, bytes)) in u.junk.iter().enumerate() {
            let kept = match bytes {
                Ok(b) => match write_new(&q.join(format!("{i}")), b) {
                    Ok(()) => format!("kept as quarantine/{i} ({} bytes)", b.len()),
                    Err(e) => format!("not kept: {}", visible_line(&e.to_string())),
                },
                Err(why) => format!("not kept: {why}"),
            };
            reasons += &format!("{}: {}; {kept}\n", visible_line(shown), visible_line(why));
        }
        let r = q.join("REASONS");
        fs::write(&r, reasons).map_err(|e| Error::io("cannot write", &r, e))?; // trusted: ROOT/archive
    }
    Ok(Some((dir, u.messages.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    fn du(dir: &Path) -> u64 {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path().symlink_metadata().unwrap().blocks() * 512)
            .sum()
    }

    #[test]
    fn the_archive_keeps_at_most_the_junk_budget_and_fills_no_hole() {
        let top = std::env::temp_dir().join(format!("lw-archive-{}", base::id::new_id()));
        let root = Root::new(top.join("root"));
        let new = root.dir.join("sandboxes/evil/outbox/new");
        fs::create_dir_all(&new).unwrap();
        // Taken by name: four sparse files first, then the dense ones.
        for i in 0..40 {
            let f = fs::File::create(new.join(format!("s{i:02}"))).unwrap();
            f.set_len(2 << 30).unwrap();
            fs::write(new.join(format!("d{i:02}")), vec![0x5a; 1_100 << 10]).unwrap();
        }
        for i in 0..4 {
            fs::rename(new.join(format!("s{i:02}")), new.join(format!("a{i:02}"))).unwrap();
        }
        let (dir, unread) = archive(&root, "evil").unwrap().unwrap();
        let q = dir.join("quarantine");
        let reasons = fs::read_to_string(q.join("REASONS")).unwrap();
        let kept = du(&q) - fs::metadata(q.join("REASONS")).unwrap().blocks() * 512;
        let cut = reasons.matches("past the 16 MiB").count();
        println!(
            "archive: 80 junk files (40 sparse 2 GiB, 40 dense 1.1 MiB): kept {} KiB, {cut} listed, not kept",
            kept >> 10
        );
        assert_eq!(unread, 0);
        assert_eq!(reasons.lines().count(), 80, "{reasons}");
        assert!(kept <= JUNK_MAX, "the archive kept {kept} bytes");
        assert!(cut > 0, "nothing was cut: {reasons}");
        for i in 0..4 {
            let m = fs::metadata(q.join(format!("{i}"))).unwrap();
            assert_eq!(m.len(), message::MAX_FILE, "a sparse file's head");
            assert!(m.blocks() * 512 <= BLOCK, "a hole was filled in");
        }
        fs::remove_dir_all(&top).unwrap();
    }
}
