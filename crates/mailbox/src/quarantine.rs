//! Taking a bad file out of a sandbox's outbox into the root's quarantine,
//! keeping at most what [`plan`] allowed (the sender's quarantine budget,
//! crates/mailbox/src/mediate/keep.rs).
//!
//! A regular file with one link, no bigger than what may be kept and with
//! no more blocks than its size needs, is renamed, whole, and its mode cut
//! to 0600 or less (no setuid, setgid or execute bit survives).  Any other
//! is copied instead, since a rename would leave the sender a link through
//! which to write the kept file (or would carry its blocks into the root):
//! the copy is a new inode (mode 0600, the mediator's) of at most the bytes
//! allowed, its head, written block by block so that a hole (a block of
//! zeros) stays a hole; a sparse file of gigabytes costs its kept head
//! only.  So is a file on another filesystem — a sandbox's mail dir is one
//! of its own (lib/sandbox/disk.rs), which is also why nothing there can be
//! linked from elsewhere.  A symbolic link leaves a note naming its target
//! (never a live link in the root, made by root).  A FIFO or socket leaves
//! a note in its place.  With [`Keep::Nothing`] (the budget is used) nothing
//! is kept: the entry is removed, its reason logged.  The source goes once
//! its replacement is durable.  A directory is renamed when it can be.  On
//! another filesystem (a sandbox's mail dir always is) it cannot: a note
//! listing what it held (at most [`NOTE_LINES`] lines) takes its place, and
//! the directory is removed by a walk of directory descriptors, each opened
//! `O_DIRECTORY|O_NOFOLLOW` beneath its parent's, so a link inside is
//! unlinked, never followed (this runs as root, on a tree the sandbox owns).
//! The walk is bounded ([`MAX_DEPTH`] levels, [`MAX_ENTRIES`] entries); a
//! tree beyond the bounds, or one that cannot be removed, is an error and
//! the caller leaves it (crates/mailbox/src/mediate says it once and never tries again).

use std::ffi::OsStr;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

/// The most of a bad file the quarantine keeps: one up to a message's size
/// limit whole, a bigger one its head of this size.
pub const KEEP: u64 = crate::message::MAX_FILE;
/// The unit a kept entry is charged in: a file system block.
pub const BLOCK: u64 = 4096;
/// What the note of a planted directory is charged (its lines are bounded).
pub const DIR_NOTE: u64 = 16 * BLOCK;
/// Lines of a planted directory's note that name what it held.
pub const NOTE_LINES: usize = 100;
/// Levels below a planted directory that are walked to remove it.
pub const MAX_DEPTH: usize = 32;
/// Entries of a planted directory that are walked to remove it.
pub const MAX_ENTRIES: usize = 100_000;

/// How much of a bad entry the quarantine keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// A regular file's first so many bytes (all of a smaller one); for
    /// anything else, its note.
    Up(u64),
    /// Nothing: the entry is removed, only its reason logged.
    Nothing,
}

/// What keeping an entry (as `st` says) is to be: what is kept, what it is
/// charged (bytes, in whole blocks, an upper bound of what it takes), and
/// whether it was cut short (or left out) for want of `room`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub keep: Keep,
    pub cost: u64,
    pub cut: bool,
}

/// Plans the keeping of an entry when `room` bytes are left of its
/// sender's budget.
pub fn plan(st: &rfs::Stat, room: u64) -> Plan {
    let (want, cost) = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {
            let want = (st.st_size.max(0) as u64).min(KEEP);
            (want, (want.div_ceil(BLOCK) * BLOCK).max(BLOCK))
        }
        FileType::Directory => (0, DIR_NOTE),
        _ => (0, BLOCK),
    };
    if cost <= room {
        return Plan {
            keep: Keep::Up(want),
            cost,
            cut: false,
        };
    }
    let head = room / BLOCK * BLOCK;
    if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && head > 0 {
        return Plan {
            keep: Keep::Up(head),
            cost: head,
            cut: true,
        };
    }
    Plan {
        keep: Keep::Nothing,
        cost: 0,
        cut: true,
    }
}

/// What a kept entry is charged to its sender's budget, as [`plan`]
/// charged it: its length in whole blocks (a sparse copy is charged as if
/// it were dense), or the blocks it takes if more, and one block at least.
pub fn charged(st: &rfs::Stat) -> u64 {
    let len = (st.st_size.max(0) as u64).div_ceil(BLOCK) * BLOCK;
    len.max((st.st_blocks.max(0) as u64) * 512).max(BLOCK)
}

/// Takes `name` from `from_dir` into `to_dir` as `to_name`, keeping what
/// `keep` allows.  Ok(false) when the source is gone (taken already).
pub fn take(
    from_dir: &OwnedFd,
    name: &OsStr,
    to_dir: &OwnedFd,
    to_name: &OsStr,
    keep: Keep,
) -> io::Result<bool> {
    let st = match rfs::statat(from_dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let ft = FileType::from_raw_mode(st.st_mode);
    let limit = match keep {
        Keep::Up(n) => n,
        Keep::Nothing if ft == FileType::Directory => {
            return remove_dir(from_dir, name, &st);
        }
        Keep::Nothing => {
            return match rfs::unlinkat(from_dir, name, AtFlags::empty()) {
                Ok(()) => Ok(true),
                Err(Errno::NOENT) => Ok(false),
                Err(e) => Err(e.into()),
            };
        }
    };
    match ft {
        FileType::RegularFile => {
            let size = st.st_size.max(0) as u64;
            let fits = size <= limit && (st.st_blocks as u64) * 512 <= size.div_ceil(BLOCK) * BLOCK;
            if st.st_nlink == 1 && fits {
                match base::fs::rename_noreplace_at(from_dir, name, to_dir, to_name) {
                    Ok(()) => {
                        let mode = Mode::from_raw_mode(st.st_mode & 0o600);
                        rfs::chmodat(to_dir, to_name, mode, AtFlags::empty())?;
                        return Ok(true);
                    }
                    Err(Errno::NOENT) => return Ok(false),
                    Err(Errno::XDEV) => {}
                    Err(e) => return Err(e.into()),
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
            copy_head(&src, &dst, limit)?;
            rfs::fsync(&dst)?;
        }
        FileType::Symlink => {
            // A note naming the target, never a live link: the root's
            // quarantine holds no link a sandbox aimed (at `/`, say).
            let target = rfs::readlinkat(from_dir, name, Vec::new())?;
            let to = crate::maildir::escape_name(OsStr::from_bytes(target.as_bytes()));
            let dst = create(to_dir, to_name)?;
            write_all(
                &dst,
                format!("a symbolic link to '{to}' (not followed, not kept as a link)\n")
                    .as_bytes(),
            )?;
            rfs::fsync(&dst)?;
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
                Err(Errno::XDEV) => note_and_remove(from_dir, name, &st, to_dir, to_name),
                Err(e) => Err(e.into()),
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
        Err(e) => Err(e.into()),
    }
}

/// Copies the first `limit` bytes of `src` into `dst`, block by block: a
/// block of zeros is skipped (a hole in the copy), so no hole of the
/// source is ever filled in.
fn copy_head(src: &OwnedFd, dst: &OwnedFd, limit: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut off = 0u64;
    while off < limit {
        let want = buf.len().min((limit - off) as usize);
        let n = rustix::io::read(src, &mut buf[..want])?;
        if n == 0 {
            break;
        }
        for block in buf[..n].chunks(BLOCK as usize) {
            if block.iter().any(|b| *b != 0) {
                let mut at = 0;
                while at < block.len() {
                    at += rustix::io::pwrite(dst, &block[at..], off + at as u64)?;
                }
            }
            off += block.len() as u64;
        }
    }
    rfs::ftruncate(dst, off)?;
    Ok(())
}

/// A planted directory removed without a note (its sender's budget is
/// used): the same walk as [`note_and_remove`].
fn remove_dir(from_dir: &OwnedFd, name: &OsStr, st: &rfs::Stat) -> io::Result<bool> {
    let dir = match open_beneath(from_dir, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    let now = rfs::fstat(&dir)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other("changed while being taken"));
    }
    walk(&dir, "", 0, &mut Walk::default(), true)?;
    drop(dir);
    match rfs::unlinkat(from_dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// A planted directory on another filesystem: a note of what it held, made
/// durable, then the directory removed.  The note is kept when a crash came
/// between the two (a later call finds it and goes on with the removal).
fn note_and_remove(
    from_dir: &OwnedFd,
    name: &OsStr,
    st: &rfs::Stat,
    to_dir: &OwnedFd,
    to_name: &OsStr,
) -> io::Result<bool> {
    let dir = match open_beneath(from_dir, name) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    // The directory may have been swapped since it was looked at.
    let now = rfs::fstat(&dir)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other("changed while being taken"));
    }
    let mut w = Walk::default();
    walk(&dir, "", 0, &mut w, false)?;
    let mut note = String::from(
        "a directory, not a message file, on another file system than the quarantine: \
         not kept; what it held is listed below, and the directory is removed from the outbox\n",
    );
    note += &format!("it held {} entries ({} listed)\n", w.entries, w.lines.len());
    for l in &w.lines {
        note += l;
        note.push('\n');
    }
    if let Some(why) = &w.beyond {
        note += &format!("not walked further: {why}\n");
    }
    match create(to_dir, to_name) {
        Ok(dst) => {
            write_all(&dst, note.as_bytes())?;
            rfs::fsync(&dst)?;
            rfs::fsync(to_dir)?;
        }
        Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    walk(&dir, "", 0, &mut Walk::default(), true)?;
    drop(dir);
    match rfs::unlinkat(from_dir, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// A directory beneath `dir`, never through a link.
fn open_beneath(dir: &OwnedFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// What a walk of a planted directory saw.
#[derive(Default)]
struct Walk {
    entries: usize,
    lines: Vec<String>,
    /// Why the walk stopped short, if it did.
    beyond: Option<String>,
}

/// Walks `dir` (at `prefix` below the planted directory): lists what it
/// holds into `w`, or, with `remove`, unlinks it all, depth first.  Nothing
/// is opened but directories, each beneath its parent's descriptor.
fn walk(dir: &OwnedFd, prefix: &str, depth: usize, w: &mut Walk, remove: bool) -> io::Result<()> {
    // Beyond the bounds a listing says so and stops; a removal fails.
    let beyond = |w: &mut Walk, why: String| {
        if remove {
            return Err(io::Error::other(why));
        }
        w.beyond.get_or_insert(why);
        Ok(())
    };
    if depth >= MAX_DEPTH {
        return beyond(
            w,
            format!("'{prefix}' is more than {MAX_DEPTH} levels deep"),
        );
    }
    let mut names = Vec::new();
    for ent in rfs::Dir::read_from(dir)? {
        let ent = ent?;
        let n = ent.file_name().to_bytes();
        if n == b"." || n == b".." {
            continue;
        }
        w.entries += 1;
        if w.entries > MAX_ENTRIES {
            return beyond(w, format!("it holds more than {MAX_ENTRIES} entries"));
        }
        names.push(OsStr::from_bytes(n).to_os_string());
    }
    for n in names {
        let st = match rfs::statat(dir, &n, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let path = format!("{prefix}{}", crate::maildir::escape_name(&n));
        let ft = FileType::from_raw_mode(st.st_mode);
        if !remove && w.lines.len() < NOTE_LINES {
            w.lines.push(match ft {
                FileType::Directory => format!("{path}/"),
                FileType::Symlink => {
                    let to = rfs::readlinkat(dir, &n, Vec::new())
                        .map(|t| crate::maildir::escape_name(OsStr::from_bytes(t.as_bytes())))
                        .unwrap_or_default();
                    format!("{path} -> {to} (a symbolic link, not followed)")
                }
                FileType::RegularFile => format!("{path} ({} bytes)", st.st_size),
                _ => format!("{path} (a FIFO, socket or device)"),
            });
        }
        if ft == FileType::Directory {
            let sub = match open_beneath(dir, &n) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            walk(&sub, &format!("{path}/"), depth + 1, w, remove)?;
        }
        if remove {
            let flags = if ft == FileType::Directory {
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            match rfs::unlinkat(dir, &n, flags) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
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

    const ALL: Keep = Keep::Up(KEEP);

    /// A scratch directory with `out/bad`, a setuid file, and an empty `q/`.
    fn planted(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("{tag}-{}", base::id::new_id()));
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
        assert!(take(&from, OsStr::new("bad"), &to, OsStr::new("Q1"), ALL).unwrap());
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        assert_eq!((m.ino(), m.mode() & 0o7777), (ino, 0o600));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_hard_link_kept_by_the_sender_cannot_write_the_quarantined_copy() {
        let d = planted("lw-quarantine");
        std::fs::hard_link(d.join("out/bad"), d.join("keep")).unwrap();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        assert!(take(&from, OsStr::new("bad"), &to, OsStr::new("Q1"), ALL).unwrap());
        assert!(!take(&from, OsStr::new("bad"), &to, OsStr::new("Q1"), ALL).unwrap());
        std::fs::write(d.join("keep"), b"changed through the link").unwrap();
        assert_eq!(std::fs::read(d.join("q/Q1")).unwrap(), b"junk");
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        assert_eq!((m.mode() & 0o7777, m.nlink()), (0o600, 1));
        assert!(!d.join("out/bad").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symbolic_link_leaves_a_note_naming_its_target_not_a_link() {
        let d = planted("lw-quarantine-link");
        std::os::unix::fs::symlink("/etc/shadow", d.join("out/link")).unwrap();
        std::os::unix::fs::symlink("/", d.join("out/root")).unwrap();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        assert!(take(&from, OsStr::new("link"), &to, OsStr::new("Q1"), ALL).unwrap());
        assert!(take(&from, OsStr::new("root"), &to, OsStr::new("Q2"), ALL).unwrap());
        for (q, target) in [("q/Q1", "'/etc/shadow'"), ("q/Q2", "'/'")] {
            let m = std::fs::symlink_metadata(d.join(q)).unwrap();
            assert!(m.file_type().is_file(), "{q} is a live link");
            assert_eq!(m.mode() & 0o7777, 0o600);
            let note = std::fs::read_to_string(d.join(q)).unwrap();
            assert!(note.contains(target), "{note}");
        }
        assert!(!d.join("out/link").exists() && d.join("out").read_dir().unwrap().count() == 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_sparse_file_keeps_its_head_and_its_holes_and_a_dense_one_its_head() {
        let d = planted("lw-quarantine-sparse");
        let f = std::fs::File::create(d.join("out/sparse")).unwrap();
        f.set_len(2 << 30).unwrap();
        rustix::io::pwrite(&f, b"head", 0).unwrap();
        rustix::io::pwrite(&f, b"mid", 600 << 10).unwrap();
        std::fs::write(d.join("out/dense"), vec![7u8; 1_100 << 10]).unwrap();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        let st = rfs::statat(&from, "sparse", AtFlags::empty()).unwrap();
        let p = plan(&st, 64 << 20);
        assert_eq!(
            p,
            Plan {
                keep: Keep::Up(KEEP),
                cost: KEEP,
                cut: false
            }
        );
        assert!(take(&from, OsStr::new("sparse"), &to, OsStr::new("Q1"), p.keep).unwrap());
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        println!(
            "sparse: kept {} bytes, {} allocated",
            m.len(),
            m.blocks() * 512
        );
        assert_eq!(m.len(), KEEP);
        assert!(
            m.blocks() * 512 <= 2 * BLOCK,
            "holes filled: {} blocks",
            m.blocks()
        );
        let kept = std::fs::read(d.join("q/Q1")).unwrap();
        assert_eq!(
            (&kept[..4], &kept[600 << 10..(600 << 10) + 3]),
            (&b"head"[..], &b"mid"[..])
        );
        // Dense and bigger than what is kept: its head, cut to the room left.
        let st = rfs::statat(&from, "dense", AtFlags::empty()).unwrap();
        let p = plan(&st, 100 << 10);
        assert_eq!(
            p,
            Plan {
                keep: Keep::Up(100 << 10),
                cost: 100 << 10,
                cut: true
            }
        );
        assert!(take(&from, OsStr::new("dense"), &to, OsStr::new("Q2"), p.keep).unwrap());
        assert_eq!(std::fs::read(d.join("q/Q2")).unwrap(), vec![7u8; 100 << 10]);
        assert!(!d.join("out/sparse").exists() && !d.join("out/dense").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn with_no_room_nothing_is_kept_and_the_entry_goes() {
        let d = planted("lw-quarantine-none");
        std::fs::write(d.join("out/big"), vec![1u8; 8192]).unwrap();
        std::os::unix::fs::symlink("/", d.join("out/link")).unwrap();
        let (from, to) = (dir(&d, "out"), dir(&d, "q"));
        for n in ["big", "link", "bad"] {
            let st = rfs::statat(&from, n, AtFlags::SYMLINK_NOFOLLOW).unwrap();
            let p = plan(&st, BLOCK - 1);
            assert_eq!((p.keep, p.cost, p.cut), (Keep::Nothing, 0, true), "{n}");
            assert!(take(&from, OsStr::new(n), &to, OsStr::new(n), p.keep).unwrap());
        }
        assert_eq!(std::fs::read_dir(d.join("out")).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(d.join("q")).unwrap().count(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// A planted directory on another filesystem than `q/`: `/dev/shm` is a
    /// tmpfs of its own where the scratch directory is not (else None).
    fn across_filesystems(tag: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        let d = planted(tag);
        let shm = std::path::Path::new("/dev/shm").join(format!("{tag}-{}", base::id::new_id()));
        std::fs::create_dir_all(shm.join("out")).ok()?;
        let dev = |p: &std::path::Path| std::fs::metadata(p).unwrap().dev();
        if dev(&shm) == dev(&d) {
            eprintln!("{tag}: /dev/shm and the temporary directory are one file system; skipped");
            return None;
        }
        Some((d, shm))
    }

    #[test]
    fn a_directory_on_another_filesystem_leaves_a_note_and_goes_without_following_a_link() {
        let Some((d, shm)) = across_filesystems("lw-quarantine-dir") else {
            return;
        };
        let canary = d.join("canary");
        std::fs::write(&canary, b"host file").unwrap();
        let planted = shm.join("out/P");
        std::fs::create_dir_all(planted.join("sub/deeper")).unwrap();
        std::fs::write(planted.join("a"), b"aaa").unwrap();
        std::fs::write(planted.join("sub/deeper/b"), b"b").unwrap();
        std::os::unix::fs::symlink(&canary, planted.join("sub/link")).unwrap();
        std::os::unix::fs::symlink(&d, planted.join("dirlink")).unwrap();
        let (from, to) = (dir(&shm, "out"), dir(&d, "q"));
        assert!(take(&from, OsStr::new("P"), &to, OsStr::new("Q1"), ALL).unwrap());
        assert!(!planted.exists(), "removed");
        assert_eq!(std::fs::read(&canary).unwrap(), b"host file");
        assert!(d.join("q").is_dir() && d.join("out/bad").is_file());
        let note = std::fs::read_to_string(d.join("q/Q1")).unwrap();
        println!("{note}");
        assert!(note.contains("it held 6 entries (6 listed)"), "{note}");
        assert!(note.contains("sub/link -> ") && note.contains("not followed"));
        assert!(note.contains("a (3 bytes)") && note.contains("sub/deeper/"));
        let m = std::fs::metadata(d.join("q/Q1")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);
        // Taken already: nothing to do.
        assert!(!take(&from, OsStr::new("P"), &to, OsStr::new("Q1"), ALL).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&shm).unwrap();
    }

    #[test]
    fn a_directory_deeper_than_the_walk_goes_is_noted_and_left() {
        let Some((d, shm)) = across_filesystems("lw-quarantine-deep") else {
            return;
        };
        let mut p = shm.join("out/P");
        for i in 0..MAX_DEPTH + 2 {
            p = p.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&p).unwrap();
        let (from, to) = (dir(&shm, "out"), dir(&d, "q"));
        let e = take(&from, OsStr::new("P"), &to, OsStr::new("Q1"), ALL).unwrap_err();
        assert!(e.to_string().contains("levels deep"), "{e}");
        assert!(shm.join("out/P").is_dir(), "left where it was");
        let note = std::fs::read_to_string(d.join("q/Q1")).unwrap();
        assert!(note.contains("not walked further"), "{note}");
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&shm).unwrap();
    }
}
