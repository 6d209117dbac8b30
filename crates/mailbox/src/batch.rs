//! Batched delivery: Maildir's delivery procedure for many messages at
//! once (a group commit).
//!
//! crates/mailbox/src/maildir/ delivers one message with two fsyncs (file, then `new/`).
//! The mediator moves thousands of messages and every one is written twice
//! (the log entry, then the inbox copy), so it runs the same procedure in
//! phases over a batch instead: create every `tmp/` file exclusively (mode
//! 0600, O_NOFOLLOW) and write it, fsync every file, rename each into `new/`
//! with RENAME_NOREPLACE, then fsync each `new/` directory once.  After
//! [`Batch::commit`] returns, every staged message is durable, exactly as if
//! each had gone through `Maildir::deliver_once`; before it returns, none is
//! visible half-written.
//!
//! How the batch is flushed is a [`Sync`] choice.  `Sync::File` (the
//! default) fsyncs exactly the files and directories the batch touched, as
//! Maildir::deliver does, but issues those fsyncs concurrently from up to
//! [`FSYNC_WORKERS`] threads (the disk serves them together; on ext4 with
//! a journal they also share commits), and nothing but the batch's own
//! inodes is written back.  [`write_tmp`] creates, writes and fsyncs many
//! files from those threads at once, for a caller that stages several
//! groups in one go (the mediator writes a batch's log entries and copies
//! together, then commits them in order).  `Sync::FileSystem` calls syncfs(2)
//! once per phase and file system instead; it is about as fast on an idle
//! disk, but it also waits for every other process's dirty data on that
//! file system, so a busy neighbour slows the mediator down (measured in
//! mailbox-spec.md, "THE MEDIATOR").
//!
//! Directories are opened from the mailbox root down, one component at a
//! time, with O_NOFOLLOW: a sandbox can replace anything inside its own
//! mailbox with a symbolic link, and the mediator must never write through
//! one into the host.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, AtFlags, Mode, OFlags};
use rustix::io::Errno;

use base::error::{Error, Exit, Result, errno_io};

/// Opens a directory relative to `base` (or an absolute/relative path from
/// the working directory when `base` is None) without following a symbolic
/// link in any component (crates/base/src/fs's one rule for sandbox-writable trees).
pub fn open_dir_at(base: Option<&OwnedFd>, rel: &Path) -> rustix::io::Result<OwnedFd> {
    match base {
        Some(b) => base::fs::open_dir_beneath(b, rel),
        None => base::fs::open_dir_no_links(rel),
    }
}

/// Creates `name` under `dir` (mode 0700) unless it exists, then opens it
/// without following links.
pub fn ensure_dir_at(dir: &OwnedFd, name: &str) -> rustix::io::Result<OwnedFd> {
    // Opened first: a pass opens every box it touches, which nearly always
    // exists, and a mkdirat that fails with EEXIST costs a lookup too.
    match open_dir_at(Some(dir), Path::new(name)) {
        Err(Errno::NOENT) => {}
        other => return other,
    }
    match rfs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(e),
    }
    open_dir_at(Some(dir), Path::new(name))
}

/// How a batch makes its writes durable (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sync {
    /// syncfs(2) once per phase and file system.
    FileSystem,
    /// fsync(2) of every file and every directory touched, concurrently.
    #[default]
    File,
}

/// Threads that issue a batch's fsyncs at once (see the module docs).
pub const FSYNC_WORKERS: usize = 32;

/// fsync(2) of every descriptor in `fds`, issued from up to
/// [`FSYNC_WORKERS`] threads at once so that the file system can commit
/// them together.  The first failure is returned, naming its path.
pub fn fsync_all(fds: &[(&OwnedFd, &Path)]) -> Result<()> {
    let results = parallel(fds.len(), |i| rfs::fsync(fds[i].0));
    match results
        .into_iter()
        .enumerate()
        .find_map(|(i, r)| r.err().map(|e| (i, e)))
    {
        Some((i, e)) => Err(Error::io_as(
            Exit::IoErr,
            "cannot fsync",
            fds[i].1,
            errno_io(e),
        )),
        None => Ok(()),
    }
}

/// An open Maildir: its `tmp/`, `new/` and `cur/` held as descriptors.
#[derive(Debug)]
pub struct OpenMaildir {
    pub path: PathBuf,
    pub tmp: OwnedFd,
    pub new: OwnedFd,
    pub cur: OwnedFd,
    /// The device of `new/`, to syncfs each file system once.
    pub dev: u64,
    /// The owner of `tmp/` when it is not the mediator: each file is given
    /// to it (Maildir::give_to_owner), asked once per pass, not per file.
    pub owner: Option<(u32, u32)>,
}

impl OpenMaildir {
    /// Opens (creating the three subdirectories when missing) the Maildir
    /// at `rel` below the directory `base`, never following a link.
    pub fn open(base: &OwnedFd, base_path: &Path, rel: &Path) -> Result<OpenMaildir> {
        let path = base_path.join(rel);
        let err = |what: &str, e: Errno| {
            let msg = if e == Errno::LOOP || e == Errno::NOTDIR {
                format!(
                    "{what} '{}' (a symbolic link or not a directory; not followed)",
                    path.display()
                )
            } else {
                format!("{what} '{}'", path.display())
            };
            Error::new(base::error::io_exit(&errno_io(e)), msg).with_source(errno_io(e))
        };
        // The Maildir's own directory may be missing (a sandbox registered
        // before its mailbox was made); its parent must exist.
        let (parent, leaf) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(l)) => (p, l),
            _ => {
                return Err(Error::new(
                    Exit::Software,
                    format!("not a mailbox path '{}'", path.display()),
                ));
            }
        };
        let pfd = open_dir_at(Some(base), parent).map_err(|e| err("cannot open", e))?;
        let leaf = leaf.to_str().ok_or_else(|| {
            Error::data(format!("mailbox path '{}' is not UTF-8", path.display()))
        })?;
        let dfd = ensure_dir_at(&pfd, leaf).map_err(|e| err("cannot open mailbox", e))?;
        let tmp = ensure_dir_at(&dfd, "tmp").map_err(|e| err("cannot open tmp/ of", e))?;
        let new = ensure_dir_at(&dfd, "new").map_err(|e| err("cannot open new/ of", e))?;
        let cur = ensure_dir_at(&dfd, "cur").map_err(|e| err("cannot open cur/ of", e))?;
        let dev = rfs::fstat(&new)
            .map_err(|e| err("cannot stat new/ of", e))?
            .st_dev as u64;
        let st = rfs::fstat(&tmp).map_err(|e| err("cannot stat tmp/ of", e))?;
        let owner =
            (st.st_uid != rustix::process::geteuid().as_raw()).then_some((st.st_uid, st.st_gid));
        Ok(OpenMaildir {
            path,
            tmp,
            new,
            cur,
            dev,
            owner,
        })
    }

    /// True when `name` is in `new/` or `cur/` (checked in that order: a
    /// reader moves new -> cur, never back, so a message moving between the
    /// two checks is still seen).
    pub fn has(&self, name: &str) -> bool {
        for d in [&self.new, &self.cur] {
            if rfs::statat(d, name, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                return true;
            }
        }
        false
    }

    pub fn fsync_new(&self) -> Result<()> {
        rfs::fsync(&self.new).map_err(|e| {
            Error::io_as(
                Exit::IoErr,
                "cannot fsync",
                &self.path.join("new"),
                errno_io(e),
            )
        })
    }

    pub fn fsync_cur(&self) -> Result<()> {
        rfs::fsync(&self.cur).map_err(|e| {
            Error::io_as(
                Exit::IoErr,
                "cannot fsync",
                &self.path.join("cur"),
                errno_io(e),
            )
        })
    }
}

struct Staged {
    boxkey: usize,
    name: String,
    /// Open until its fsync; None once the data is durable (a batch of
    /// thousands of files holds no descriptor for each).
    fd: Option<OwnedFd>,
}

/// One file for [`write_tmp`]: `bytes` as `tmp/NAME` of `boxes[key]`.
pub struct Write {
    pub key: usize,
    pub name: String,
    pub bytes: Vec<u8>,
}

/// Creates and writes each file in `tmp/` of its box, and fsyncs it when
/// `fsync` (the batch's [`Sync::File`]), from up to [`FSYNC_WORKERS`]
/// threads at once: creating a file costs CPU (on ext4
/// without a journal, a scan past recently deleted inodes) and its fsync
/// waits on the disk, so a batch's files overlap both.  One result per
/// write, in order; a file that failed is unlinked.  Nothing is visible
/// in `new/` yet: [`Batch::adopt`] and [`Batch::commit`] do that.
pub fn write_tmp(boxes: &[OpenMaildir], writes: &[Write], fsync: bool) -> Vec<Result<OwnedFd>> {
    let one = |w: &Write| -> Result<OwnedFd> {
        let fd = create_tmp(boxes, w.key, &w.name, &w.bytes)?;
        let b = &boxes[w.key];
        if !fsync {
            return Ok(fd);
        }
        if let Err(e) = rfs::fsync(&fd) {
            let _ = rfs::unlinkat(&b.tmp, w.name.as_str(), AtFlags::empty());
            let p = b.path.join("tmp").join(&w.name);
            return Err(Error::io_as(Exit::IoErr, "cannot fsync", &p, errno_io(e)));
        }
        Ok(fd)
    };
    parallel(writes.len(), |i| one(&writes[i]))
}

/// `f(0..n)` from up to [`FSYNC_WORKERS`] threads; the results in order.
fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + std::marker::Sync) -> Vec<T> {
    if n <= 1 {
        return (0..n).map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: Vec<std::sync::Mutex<Option<T>>> =
        (0..n).map(|_| std::sync::Mutex::new(None)).collect();
    let work = || {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= n {
                break;
            }
            let r = f(i);
            *out[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..n.min(FSYNC_WORKERS) {
            s.spawn(work);
        }
        work();
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every index is run once")
        })
        .collect()
}

/// Creates `tmp/NAME` of `boxes[key]` exclusively (mode 0600, never
/// through a link), gives it to the owner of `tmp/` and writes `bytes`; a
/// stray file of a crashed earlier attempt is replaced (nobody reads tmp/).
fn create_tmp(boxes: &[OpenMaildir], key: usize, name: &str, bytes: &[u8]) -> Result<OwnedFd> {
    let b = &boxes[key];
    let tmp_path = || b.path.join("tmp").join(name);
    let open = || {
        rfs::openat(
            &b.tmp,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
    };
    let fd = match open() {
        Ok(fd) => fd,
        Err(Errno::EXIST) => {
            let _ = rfs::unlinkat(&b.tmp, name, AtFlags::empty());
            open().map_err(|e| Error::io("cannot create", &tmp_path(), errno_io(e)))?
        }
        Err(e) => return Err(Error::io("cannot create", &tmp_path(), errno_io(e))),
    };
    let given = b.owner.map_or(Ok(()), |(uid, gid)| {
        rfs::fchown(
            &fd,
            Some(rustix::process::Uid::from_raw(uid)),
            Some(rustix::process::Gid::from_raw(gid)),
        )
    });
    if let Err(e) = given {
        let _ = rfs::unlinkat(&b.tmp, name, AtFlags::empty());
        return Err(Error::io_as(
            Exit::NoPerm,
            "cannot give the message to the owner of",
            &b.path.join("tmp"),
            errno_io(e),
        ));
    }
    if let Err(e) = crate::maildir::write_all(&fd, bytes) {
        let _ = rfs::unlinkat(&b.tmp, name, AtFlags::empty());
        return Err(Error::io_as(Exit::IoErr, "cannot write", &tmp_path(), e));
    }
    Ok(fd)
}

/// A batch of deliveries to one or more Maildirs.
#[derive(Default)]
pub struct Batch {
    staged: Vec<Staged>,
    seen: HashSet<(usize, String)>,
    pub sync: Sync,
}

/// syncfs(2) of each distinct file system among `fds`.
pub fn sync_filesystems<'a>(fds: impl Iterator<Item = (u64, &'a OwnedFd, &'a Path)>) -> Result<()> {
    let mut done = HashSet::new();
    for (dev, fd, path) in fds {
        if done.insert(dev) {
            rfs::syncfs(fd).map_err(|e| {
                Error::io_as(
                    Exit::IoErr,
                    "cannot sync the file system of",
                    path,
                    errno_io(e),
                )
            })?;
        }
    }
    Ok(())
}

/// What a commit did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Messages that were written.
    pub new: usize,
    /// Messages found in `new/` or `cur/` already (an earlier run delivered them).
    pub already: usize,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    pub fn with_sync(sync: Sync) -> Batch {
        Batch {
            sync,
            ..Batch::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }

    /// Writes `bytes` to `tmp/NAME` of `boxes[key]` unless the message is
    /// there already (in `new/` or `cur/`, or staged in this batch): the
    /// delivery is idempotent by name.  Returns false when nothing was staged.
    pub fn stage(
        &mut self,
        boxes: &[OpenMaildir],
        key: usize,
        name: &str,
        bytes: &[u8],
    ) -> Result<bool> {
        if !self.wants(boxes, key, name) {
            return Ok(false);
        }
        let fd = create_tmp(boxes, key, name, bytes)?;
        self.staged.push(Staged {
            boxkey: key,
            name: name.to_string(),
            fd: Some(fd),
        });
        Ok(true)
    }

    /// True when `name` is neither in `new/` or `cur/` of `boxes[key]` nor
    /// wanted already by this batch; the name is then reserved in it, for a
    /// file that [`write_tmp`] writes and [`Batch::adopt`] takes.
    pub fn wants(&mut self, boxes: &[OpenMaildir], key: usize, name: &str) -> bool {
        if self.seen.contains(&(key, name.to_string())) || boxes[key].has(name) {
            return false;
        }
        self.seen.insert((key, name.to_string()));
        true
    }

    /// Takes a file that [`write_tmp`] wrote (`synced`: and fsynced).
    pub fn adopt(&mut self, key: usize, name: &str, fd: OwnedFd, synced: bool) {
        self.staged.push(Staged {
            boxkey: key,
            name: name.to_string(),
            fd: (!synced).then_some(fd),
        });
    }

    /// Unlinks what was staged and not committed (a batch that failed).
    pub fn discard(&mut self, boxes: &[OpenMaildir]) {
        for s in std::mem::take(&mut self.staged) {
            let _ = rfs::unlinkat(&boxes[s.boxkey].tmp, s.name.as_str(), AtFlags::empty());
        }
        self.seen.clear();
    }

    /// Makes every staged message durable and visible; see the module docs.
    pub fn commit(&mut self, boxes: &[OpenMaildir]) -> Result<Committed> {
        let staged = std::mem::take(&mut self.staged);
        self.seen.clear();
        let mut done = Committed::default();
        let unlink_all = |list: &[Staged]| {
            for s in list {
                let _ = rfs::unlinkat(&boxes[s.boxkey].tmp, s.name.as_str(), AtFlags::empty());
            }
        };
        let unsynced = staged.iter().filter(|s| s.fd.is_some()).count();
        let by_fs = self.sync == Sync::FileSystem && unsynced > 1;
        if by_fs {
            let fds = staged.iter().map(|s| {
                (
                    boxes[s.boxkey].dev,
                    &boxes[s.boxkey].tmp,
                    boxes[s.boxkey].path.as_path(),
                )
            });
            if let Err(e) = sync_filesystems(fds) {
                unlink_all(&staged);
                return Err(e);
            }
        } else {
            let fds: Vec<(&OwnedFd, PathBuf)> = staged
                .iter()
                .filter_map(|s| Some((s.fd.as_ref()?, s)))
                .map(|(fd, s)| (fd, boxes[s.boxkey].path.join("tmp").join(&s.name)))
                .collect();
            let refs: Vec<(&OwnedFd, &Path)> = fds.iter().map(|(f, p)| (*f, p.as_path())).collect();
            if let Err(e) = fsync_all(&refs) {
                unlink_all(&staged);
                return Err(e);
            }
        }
        let mut dirty: HashMap<usize, ()> = HashMap::new();
        for (i, s) in staged.iter().enumerate() {
            let b = &boxes[s.boxkey];
            match base::fs::rename_noreplace_at(
                &b.tmp,
                OsStr::new(&s.name),
                &b.new,
                OsStr::new(&s.name),
            ) {
                Ok(()) => {
                    done.new += 1;
                    dirty.insert(s.boxkey, ());
                }
                Err(Errno::EXIST) => {
                    // Delivered meanwhile by someone else under the same name:
                    // ours is the same message (names are unique), keep theirs.
                    let _ = rfs::unlinkat(&b.tmp, s.name.as_str(), AtFlags::empty());
                    done.already += 1;
                }
                Err(e) => {
                    unlink_all(&staged[i..]);
                    let p = b.path.join("new").join(&s.name);
                    return Err(Error::io("cannot move message into", &p, errno_io(e)));
                }
            }
        }
        if self.sync == Sync::FileSystem && dirty.len() > 1 {
            sync_filesystems(
                dirty
                    .keys()
                    .map(|k| (boxes[*k].dev, &boxes[*k].new, boxes[*k].path.as_path())),
            )?;
        } else {
            let dirs: Vec<(&OwnedFd, PathBuf)> = dirty
                .keys()
                .map(|k| (&boxes[*k].new, boxes[*k].path.join("new")))
                .collect();
            let refs: Vec<(&OwnedFd, &Path)> =
                dirs.iter().map(|(f, p)| (*f, p.as_path())).collect();
            fsync_all(&refs)?;
        }
        Ok(done)
    }
}

/// Moves `name` from `from_dir` to `to_dir` (as `to_name`) without replacing
/// anything.  Ok(false) when the source is gone (moved already).
pub fn move_noreplace(
    from_dir: &OwnedFd,
    name: &OsStr,
    to_dir: &OwnedFd,
    to_name: &OsStr,
) -> rustix::io::Result<bool> {
    match base::fs::rename_noreplace_at(from_dir, name, to_dir, to_name) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("lw-batch-{}", base::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn commits_many_once_and_skips_what_is_there() {
        let d = tempdir();
        let base = open_dir_at(None, &d).unwrap();
        let boxes = vec![
            OpenMaildir::open(&base, &d, Path::new("a")).unwrap(),
            OpenMaildir::open(&base, &d, Path::new("b")).unwrap(),
        ];
        let mut g = Batch::new();
        for i in 0..10 {
            assert!(g.stage(&boxes, i % 2, &format!("m{i}"), b"x").unwrap());
        }
        assert!(!g.stage(&boxes, 0, "m0", b"x").unwrap(), "staged twice");
        assert_eq!(
            g.commit(&boxes).unwrap(),
            Committed {
                new: 10,
                already: 0
            }
        );
        assert_eq!(std::fs::read_dir(d.join("a/new")).unwrap().count(), 5);
        assert_eq!(std::fs::read_dir(d.join("a/tmp")).unwrap().count(), 0);
        std::fs::rename(d.join("a/new/m0"), d.join("a/cur/m0")).unwrap();
        assert!(!g.stage(&boxes, 0, "m0", b"x").unwrap(), "already in cur/");
        assert!(!g.stage(&boxes, 1, "m1", b"x").unwrap(), "already in new/");
    }

    #[test]
    fn never_follows_a_planted_link() {
        let d = tempdir();
        let outside = tempdir();
        std::fs::create_dir_all(d.join("box")).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("box/new")).unwrap();
        let base = open_dir_at(None, &d).unwrap();
        let err = OpenMaildir::open(&base, &d, Path::new("box")).unwrap_err();
        assert!(err.to_string().contains("not followed"), "{err}");
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        assert!(OpenMaildir::open(&base, &d, Path::new("link/inbox")).is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }
}
