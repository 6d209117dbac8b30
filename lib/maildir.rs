//! One Maildir-style directory (`tmp/`, `new/`, `cur/`) and the two procedures
//! on it: delivery and claim (mailbox-spec.md, "DELIVERY" and "CLAIM").
//!
//! Delivery: create `tmp/NAME` exclusively (mode 0600, O_NOFOLLOW), write,
//! fsync the file, rename it into `new/NAME` with RENAME_NOREPLACE, fsync
//! `new/`.  After the directory fsync the message survives a power cut; before
//! the rename no reader can see it, so a half-written message is never visible
//! in `new/`.  A crash leaves at most a stray file in `tmp/`, which nobody
//! reads.  RENAME_NOREPLACE (not rename(2), which silently replaces) makes a
//! name collision an error instead of a lost message.
//!
//! Claim: rename `new/NAME` to `cur/NAME` with RENAME_NOREPLACE.  ENOENT means
//! another reader (or an earlier run of this one) claimed it already, so a
//! re-scan after a crash is harmless.
//!
//! Reading opens entries with O_NOFOLLOW|O_NONBLOCK and checks with fstat that
//! they are regular files, so a planted symlink is never followed and a FIFO
//! never blocks the reader; such entries are reported, not opened.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Error, Exit, Result, errno_io};
use crate::message::{self, Message};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Tmp,
    New,
    Cur,
}

impl Sub {
    pub fn as_str(self) -> &'static str {
        match self {
            Sub::Tmp => "tmp",
            Sub::New => "new",
            Sub::Cur => "cur",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Maildir {
    pub path: PathBuf,
}

/// What a directory entry turned out to be.
#[derive(Debug)]
pub enum Found {
    /// A regular file that parses and validates.
    Message(Message),
    /// A regular file, or a name, that does not: the reason says why.
    Bad(String),
    /// Not a regular file (symlink, FIFO, directory, device, socket): never opened.
    NotFile(&'static str),
    /// The entry vanished between listing and opening (claimed by someone else).
    Gone,
}

/// One entry of `new/` or `cur/`.
#[derive(Debug)]
pub struct Entry {
    pub name: OsString,
    pub found: Found,
}

impl Entry {
    /// The name as text, with anything unprintable escaped (names may hold
    /// newlines or invalid UTF-8 when something other than loopwright wrote them).
    pub fn display_name(&self) -> String {
        escape_name(&self.name)
    }
}

/// A file name made safe for one line of output.
pub fn escape_name(name: &OsStr) -> String {
    String::from_utf8_lossy(name.as_bytes())
        .escape_debug()
        .to_string()
        + if std::str::from_utf8(name.as_bytes()).is_err() {
            " (invalid UTF-8)"
        } else {
            ""
        }
}

/// Whether a delivery wrote the message or found it delivered already.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    New(PathBuf),
    Already(PathBuf),
}

fn open_dir(path: &Path) -> rustix::io::Result<OwnedFd> {
    rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

impl Maildir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Maildir { path: path.into() }
    }

    pub fn sub(&self, s: Sub) -> PathBuf {
        self.path.join(s.as_str())
    }

    /// Creates `tmp/`, `new/` and `cur/` (mode 0700).  The Maildir's own
    /// directory is created too when its parent exists.
    pub fn create(&self) -> Result<()> {
        match std::fs::create_dir(&self.path) {
            Ok(()) => set_mode(&self.path, 0o700)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("cannot create mailbox directory", &self.path, e)),
        }
        for s in [Sub::Tmp, Sub::New, Sub::Cur] {
            let p = self.sub(s);
            match std::fs::create_dir(&p) {
                Ok(()) => set_mode(&p, 0o700)?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(Error::io("cannot create mailbox directory", &p, e)),
            }
        }
        Ok(())
    }

    /// Delivers `bytes` as `new/NAME` by the delivery procedure.  The
    /// directories are created on first use when the Maildir's parent exists.
    pub fn deliver(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let tmp = match open_dir(&self.sub(Sub::Tmp)) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                self.create_checked()?;
                open_dir(&self.sub(Sub::Tmp))
                    .map_err(|e| Error::io("cannot open", &self.sub(Sub::Tmp), errno_io(e)))?
            }
            Err(e) => return Err(Error::io("cannot open", &self.sub(Sub::Tmp), errno_io(e))),
        };
        let new = open_dir(&self.sub(Sub::New))
            .map_err(|e| Error::io("cannot open", &self.sub(Sub::New), errno_io(e)))?;
        self.deliver_at(&tmp, &new, name, bytes)
    }

    fn create_checked(&self) -> Result<()> {
        let parent = self.path.parent().unwrap_or(Path::new("."));
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(Error::new(
                Exit::CantCreat,
                format!(
                    "mailbox '{}' does not exist; create it or point LW_MAILBOX/--mailbox at an existing mailbox",
                    parent.display()
                ),
            ));
        }
        self.create()
    }

    fn deliver_at(
        &self,
        tmp: &OwnedFd,
        new: &OwnedFd,
        name: &str,
        bytes: &[u8],
    ) -> Result<PathBuf> {
        let tmp_path = self.sub(Sub::Tmp).join(name);
        let fd = rfs::openat(
            tmp,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| Error::io("cannot create", &tmp_path, errno_io(e)))?;
        let cleanup = |err: Error| {
            let _ = rfs::unlinkat(tmp, name, rfs::AtFlags::empty());
            err
        };
        give_to_owner(tmp, &fd).map_err(|e| {
            cleanup(Error::io_as(
                Exit::NoPerm,
                "cannot give the message to the owner of",
                &self.sub(Sub::Tmp),
                errno_io(e),
            ))
        })?;
        write_all(&fd, bytes)
            .map_err(|e| cleanup(Error::io_as(Exit::IoErr, "cannot write", &tmp_path, e)))?;
        rfs::fsync(&fd).map_err(|e| {
            cleanup(Error::io_as(
                Exit::IoErr,
                "cannot fsync",
                &tmp_path,
                errno_io(e),
            ))
        })?;
        drop(fd);
        let new_path = self.sub(Sub::New).join(name);
        crate::fs::rename_noreplace_at(tmp, OsStr::new(name), new, OsStr::new(name)).map_err(
            |e| {
                cleanup(Error::io_as(
                    if e == Errno::EXIST {
                        Exit::Software
                    } else {
                        crate::error::io_exit(&errno_io(e))
                    },
                    "cannot move message into",
                    &new_path,
                    errno_io(e),
                ))
            },
        )?;
        // The message is visible now; if this fsync fails the caller must not
        // report success, but the file stays (removing it could lose a message
        // a reader already took).
        rfs::fsync(new).map_err(|e| {
            Error::io_as(
                Exit::IoErr,
                "cannot fsync",
                &self.sub(Sub::New),
                errno_io(e),
            )
        })?;
        Ok(new_path)
    }

    /// Delivers unless a message of that name is already in `new/` or `cur/`:
    /// the idempotent delivery the mediator uses, so that a crash between
    /// delivering and recording gives one copy, not two.  Only one writer may
    /// use this on a Maildir at a time (the mediator holds its lock).
    pub fn deliver_once(&self, name: &str, bytes: &[u8]) -> Result<Delivered> {
        // new/ before cur/: a reader moves new -> cur, never back, so this
        // order cannot miss a message that moves between the two checks.
        for s in [Sub::New, Sub::Cur] {
            let p = self.sub(s).join(name);
            if p.symlink_metadata().is_ok() {
                return Ok(Delivered::Already(p));
            }
        }
        match self.deliver(name, bytes) {
            Ok(p) => Ok(Delivered::New(p)),
            Err(e) if is_errno(&e, Errno::EXIST) => {
                // A stray tmp file from a crashed earlier attempt, or the
                // message appeared in new/ meanwhile.
                let p = self.sub(Sub::New).join(name);
                if p.symlink_metadata().is_ok() {
                    return Ok(Delivered::Already(p));
                }
                let _ = std::fs::remove_file(self.sub(Sub::Tmp).join(name));
                self.deliver(name, bytes).map(Delivered::New)
            }
            Err(e) => Err(e),
        }
    }

    /// Posts a message under its id.
    pub fn deliver_message(&self, m: &Message) -> Result<PathBuf> {
        self.deliver(&m.id, &m.to_bytes())
    }

    /// The names in `new/` or `cur/`, sorted (so by time for well-formed names).
    pub fn names(&self, s: Sub) -> Result<Vec<OsString>> {
        let dir = self.sub(s);
        let rd = std::fs::read_dir(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read mailbox directory", &dir, e))?;
        let mut names = Vec::new();
        for ent in rd {
            match ent {
                Ok(e) => names.push(e.file_name()),
                Err(e) => {
                    return Err(Error::io_as(
                        Exit::IoErr,
                        "cannot read mailbox directory",
                        &dir,
                        e,
                    ));
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Reads one entry without following links or blocking on FIFOs.
    pub fn read(&self, s: Sub, name: &OsStr) -> Found {
        let Ok(text) = std::str::from_utf8(name.as_bytes()) else {
            return Found::Bad("file name is not UTF-8".into());
        };
        let path = self.sub(s).join(name);
        let fd = match rfs::open(
            &path,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Found::Gone,
            Err(Errno::LOOP) | Err(Errno::MLINK) => return Found::NotFile("symbolic link"),
            Err(e) => return Found::Bad(format!("cannot open: {}", errno_io(e))),
        };
        let st = match rfs::fstat(&fd) {
            Ok(st) => st,
            Err(e) => return Found::Bad(format!("cannot stat: {}", errno_io(e))),
        };
        match rfs::FileType::from_raw_mode(st.st_mode) {
            rfs::FileType::RegularFile => {}
            rfs::FileType::Directory => return Found::NotFile("directory"),
            rfs::FileType::Fifo => return Found::NotFile("FIFO"),
            rfs::FileType::Symlink => return Found::NotFile("symbolic link"),
            rfs::FileType::Socket => return Found::NotFile("socket"),
            _ => return Found::NotFile("device"),
        }
        if !crate::id::is_valid(text) {
            return Found::Bad("file name does not follow the id grammar".into());
        }
        if st.st_size as u64 > message::MAX_FILE {
            return Found::Bad(format!(
                "file is {} bytes; the limit is {}",
                st.st_size,
                message::MAX_FILE
            ));
        }
        let mut buf = Vec::with_capacity(st.st_size as usize);
        let mut f = std::fs::File::from(fd);
        // take() guards against a file that grows after the fstat.
        if let Err(e) = (&mut f).take(message::MAX_FILE + 1).read_to_end(&mut buf) {
            return Found::Bad(format!("cannot read: {e}"));
        }
        match Message::parse(&buf) {
            Ok(m) if m.id != text => {
                Found::Bad(format!("id '{}' inside does not match the file name", m.id))
            }
            Ok(m) => Found::Message(m),
            Err(e) => Found::Bad(e.0),
        }
    }

    /// Every entry of `new/` or `cur/`, read.
    pub fn scan(&self, s: Sub) -> Result<Vec<Entry>> {
        Ok(self
            .names(s)?
            .into_iter()
            .map(|name| Entry {
                found: self.read(s, &name),
                name,
            })
            .collect())
    }

    /// Moves `new/NAME` to `cur/NAME`.  Returns false when it was not in `new/`
    /// (claimed already): claiming twice is not an error.
    pub fn claim(&self, name: &OsStr) -> Result<bool> {
        let from = self.sub(Sub::New).join(name);
        let to = self.sub(Sub::Cur).join(name);
        match crate::fs::rename_noreplace_at(rfs::CWD, from.as_os_str(), rfs::CWD, to.as_os_str()) {
            Ok(()) => {}
            Err(Errno::NOENT) if !self.sub(Sub::Cur).is_dir() => {
                return Err(Error::io_as(
                    Exit::NoInput,
                    "cannot claim into",
                    &self.sub(Sub::Cur),
                    errno_io(Errno::NOENT),
                ));
            }
            Err(Errno::NOENT) => return Ok(false),
            Err(Errno::EXIST) => {
                return Err(Error::io_as(
                    Exit::DataErr,
                    "a message of that name was claimed already; left in place",
                    &from,
                    errno_io(Errno::EXIST),
                ));
            }
            Err(e) => return Err(Error::io("cannot move", &from, errno_io(e))),
        }
        let cur = open_dir(&self.sub(Sub::Cur))
            .map_err(|e| Error::io("cannot open", &self.sub(Sub::Cur), errno_io(e)))?;
        rfs::fsync(&cur).map_err(|e| {
            Error::io_as(
                Exit::IoErr,
                "cannot fsync",
                &self.sub(Sub::Cur),
                errno_io(e),
            )
        })?;
        Ok(true)
    }

    /// Blocks until `ready()` says so or `timeout` passes; true when ready.
    /// `ready` is asked once at the start and again after every change in
    /// `new/`.  Uses inotify, not polling: the watch is set before the first
    /// check, so an arrival between the two is not missed.  On a 9P
    /// filesystem (a gVisor sandbox's mounts, [`shared_from_outside`]) it
    /// also rescans every [`OUTSIDE_TICK`], since the host's deliveries
    /// raise no event there.
    pub fn wait_until(
        &self,
        timeout: Option<Duration>,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<bool> {
        use crate::fs::{Watcher, Woke};
        let dir = self.sub(Sub::New);
        let watcher = Watcher::new().map_err(|e| Error::io("cannot watch", &dir, e))?;
        watcher
            .add(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot watch", &dir, e))?;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let tick = shared_from_outside(&dir).then_some(OUTSIDE_TICK);
        loop {
            if ready()? {
                return Ok(true);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Ok(false),
                },
                None => None,
            };
            // On a filesystem whose changes from outside inotify never
            // reports, wake on a short tick too (see `shared_from_outside`).
            let left = match (left, tick) {
                (Some(l), Some(t)) => Some(l.min(t)),
                (l, t) => l.or(t),
            };
            // Whatever woke us, the directory itself is the truth.
            match watcher
                .wait(left)
                .map_err(|e| Error::io("cannot wait on", &dir, e))?
            {
                Woke::Gone(_) => {
                    return Err(Error::io_as(
                        Exit::NoInput,
                        "mailbox directory was removed while waiting",
                        &dir,
                        errno_io(Errno::NOENT),
                    ));
                }
                Woke::Timeout | Woke::Changed | Woke::Overflow => {}
            }
        }
    }

    /// Blocks until `new/` has any entry or `timeout` passes.
    pub fn wait_new(&self, timeout: Option<Duration>) -> Result<bool> {
        self.wait_until(timeout, || self.has_new())
    }

    /// True when `new/` has at least one entry, of any kind.
    pub fn has_new(&self) -> Result<bool> {
        let dir = self.sub(Sub::New);
        let mut rd = std::fs::read_dir(&dir)
            .map_err(|e| Error::io_as(Exit::NoInput, "cannot read mailbox directory", &dir, e))?;
        Ok(rd.next().is_some())
    }
}

/// How old a file in `tmp/` must be before [`sweep_tmp`] removes it: a
/// writer killed mid-delivery leaves one there, and nobody reads `tmp/`
/// (mailbox-spec.md, "Delivery"; the same 36 hours as Maildir).
pub const TMP_MAX_AGE: Duration = Duration::from_secs(36 * 3600);

/// Removes the plain files in `M/tmp/` last modified longer ago than
/// `max_age`; returns how many.  Nothing else is touched: a directory, a
/// link or a FIFO planted in `tmp/` stays (it is reported elsewhere), links
/// are never followed, and a missing `tmp/` is no error.
pub fn sweep_tmp(maildir: &Path, max_age: Duration) -> io::Result<usize> {
    let tmp = maildir.join("tmp");
    let dir = match rfs::open(
        &tmp,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(d) => d,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => return Ok(0),
        Err(e) => return Err(errno_io(e)),
    };
    let now = crate::time::now();
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

/// Gives the file `fd` to the owner and group of the directory `dir` when
/// they differ from this process's user.  A message belongs to whoever owns
/// the Maildir it is delivered into: the mediator runs as root and delivers
/// into inboxes that belong to a sandbox's unprivileged user, who must be
/// able to read and claim them.
pub fn give_to_owner(dir: &impl AsFd, fd: &impl AsFd) -> rustix::io::Result<()> {
    let st = rfs::fstat(dir)?;
    if st.st_uid != rustix::process::geteuid().as_raw() {
        rfs::fchown(
            fd,
            Some(rustix::process::Uid::from_raw(st.st_uid)),
            Some(rustix::process::Gid::from_raw(st.st_gid)),
        )?;
    }
    Ok(())
}

fn set_mode(p: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("cannot set mode of", p, e))
}

/// write(2) until every byte is written, retrying on EINTR.
pub(crate) fn write_all(fd: &impl AsFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::INTR) => {}
            Err(e) => return Err(errno_io(e)),
        }
    }
    Ok(())
}

/// True when the error was caused by the given errno.
pub fn is_errno(e: &Error, errno: Errno) -> bool {
    e.source
        .as_ref()
        .and_then(|s| s.downcast_ref::<io::Error>())
        .and_then(|e| e.raw_os_error())
        == Some(errno.raw_os_error())
}

/// How often a waiter rescans a directory whose outside changes inotify
/// does not report.
pub const OUTSIDE_TICK: Duration = Duration::from_millis(100);

/// True when `dir` is on a 9P filesystem: a gVisor sandbox's bind mounts
/// (runsc's gofer) and other 9P shares, where inotify reports the changes
/// made inside the sandbox but never those made by the host (the mediator's
/// deliveries).  A waiter there also rescans every [`OUTSIDE_TICK`].
pub fn shared_from_outside(dir: &Path) -> bool {
    const V9FS_MAGIC: u64 = 0x0102_1997;
    rustix::fs::statfs(dir).is_ok_and(|s| s.f_type as u64 == V9FS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Kind;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("lw-maildir-{}", crate::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn msg() -> Message {
        Message {
            version: 1,
            id: crate::id::new_id(),
            from: "a".into(),
            to: vec!["b".into()],
            kind: Kind::Status,
            subject: "s".into(),
            body: "b".into(),
            refs: vec![],
            in_reply_to: None,
            created: crate::time::rfc3339(crate::time::now()),
        }
    }

    #[test]
    fn deliver_scan_claim() {
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        let m = msg();
        let p = md.deliver_message(&m).unwrap();
        assert!(p.ends_with(format!("new/{}", m.id)));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let entries = md.scan(Sub::New).unwrap();
        assert!(matches!(&entries[..], [Entry { found: Found::Message(x), .. }] if *x == m));
        assert!(md.claim(OsStr::new(&m.id)).unwrap());
        assert!(
            !md.claim(OsStr::new(&m.id)).unwrap(),
            "second claim is a no-op"
        );
        assert!(md.scan(Sub::New).unwrap().is_empty());
        assert_eq!(md.scan(Sub::Cur).unwrap().len(), 1);
        assert!(
            std::fs::read_dir(md.sub(Sub::Tmp))
                .unwrap()
                .next()
                .is_none()
        );
    }

    #[test]
    fn deliver_once_is_idempotent_across_claims() {
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        let m = msg();
        assert!(matches!(
            md.deliver_once(&m.id, &m.to_bytes()).unwrap(),
            Delivered::New(_)
        ));
        assert!(matches!(
            md.deliver_once(&m.id, &m.to_bytes()).unwrap(),
            Delivered::Already(_)
        ));
        md.claim(OsStr::new(&m.id)).unwrap();
        assert!(matches!(
            md.deliver_once(&m.id, &m.to_bytes()).unwrap(),
            Delivered::Already(_)
        ));
        // A stray tmp file from a crash does not block the delivery.
        let m2 = msg();
        std::fs::write(md.sub(Sub::Tmp).join(&m2.id), b"half").unwrap();
        assert!(matches!(
            md.deliver_once(&m2.id, &m2.to_bytes()).unwrap(),
            Delivered::New(_)
        ));
        assert!(matches!(
            md.read(Sub::New, OsStr::new(&m2.id)),
            Found::Message(_)
        ));
    }

    #[test]
    fn deliver_never_replaces() {
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        let m = msg();
        md.deliver_message(&m).unwrap();
        let err = md.deliver(&m.id, b"other").unwrap_err();
        assert!(is_errno(&err, Errno::EXIST), "{err}");
        assert!(matches!(
            md.read(Sub::New, OsStr::new(&m.id)),
            Found::Message(_)
        ));
        assert!(
            std::fs::read_dir(md.sub(Sub::Tmp))
                .unwrap()
                .next()
                .is_none(),
            "tmp cleaned"
        );
    }

    #[test]
    fn odd_entries_are_reported_not_followed() {
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        md.create().unwrap();
        let new = md.sub(Sub::New);
        let target = d.join("secret");
        std::fs::write(&target, msg().to_bytes()).unwrap();
        std::os::unix::fs::symlink(
            &target,
            new.join("1000000000.000000000.00000000000000000000000000000001"),
        )
        .unwrap();
        rustix::fs::mknodat(
            rfs::CWD,
            new.join("1000000000.000000000.00000000000000000000000000000002"),
            rfs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        std::fs::create_dir(new.join("1000000000.000000000.00000000000000000000000000000003"))
            .unwrap();
        std::fs::write(
            new.join("1000000000.000000000.00000000000000000000000000000004"),
            b"{not json",
        )
        .unwrap();
        std::fs::write(new.join(OsStr::from_bytes(b"bad\nname\xff")), b"x").unwrap();
        let found: Vec<_> = md
            .scan(Sub::New)
            .unwrap()
            .into_iter()
            .map(|e| e.found)
            .collect();
        assert!(
            matches!(found[0], Found::NotFile("symbolic link")),
            "{found:?}"
        );
        assert!(matches!(found[1], Found::NotFile("FIFO")));
        assert!(matches!(found[2], Found::NotFile("directory")));
        assert!(matches!(&found[3], Found::Bad(r) if r.contains("not JSON")));
        assert!(matches!(&found[4], Found::Bad(r) if r.contains("not UTF-8")));
    }

    #[test]
    fn delivered_files_belong_to_the_maildirs_owner() {
        if !rustix::process::geteuid().is_root() {
            return; // only root can give files away; the suite runs as root in CI
        }
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        md.create().unwrap();
        for s in [Sub::Tmp, Sub::New, Sub::Cur] {
            rfs::chown(
                md.sub(s),
                Some(rustix::process::Uid::from_raw(1234)),
                Some(rustix::process::Gid::from_raw(1235)),
            )
            .unwrap();
        }
        let p = md.deliver_message(&msg()).unwrap();
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (1234, 1235, 0o600));
    }

    #[test]
    fn missing_mailbox_is_named() {
        let d = tempdir();
        let md = Maildir::new(d.join("nope").join("outbox"));
        let err = md.deliver("x", b"y").unwrap_err();
        assert_eq!(err.exit, Exit::CantCreat);
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn wait_new_wakes_on_arrival_and_times_out() {
        let d = tempdir();
        let md = Maildir::new(d.join("box"));
        md.create().unwrap();
        assert!(!md.wait_new(Some(Duration::from_millis(50))).unwrap());
        let md2 = md.clone();
        let t = std::thread::spawn(move || md2.wait_new(Some(Duration::from_secs(30))).unwrap());
        md.deliver_message(&msg()).unwrap();
        assert!(t.join().unwrap());
    }
}
