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
//!
//! By file: this one holds the directory, reading and claim; `deliver` the
//! delivery; `wait` waiting for arrivals; `sweep` the cleaning of `tmp/`.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{self as rfs, Mode, OFlags};
use rustix::io::Errno;

use crate::message::{self, Message};
use base::error::{Error, Exit, Result, errno_io};

mod deliver;
mod sweep;
mod twin;
mod wait;

pub use sweep::{TMP_MAX_AGE, sweep_tmp};
pub use twin::settle_claimed;
pub use wait::{OUTSIDE_TICK, shared_from_outside};

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
        if s == Sub::New
            && let (Ok(new), Ok(cur)) = (open_dir(&dir), open_dir(&self.sub(Sub::Cur)))
        {
            // A claim a power cut half-kept is a claim (twin.rs).
            names.retain(|n| !settle_claimed(&new, &cur, n));
        }
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
        if !base::id::is_valid(text) {
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
        match base::fs::rename_noreplace_at(rfs::CWD, from.as_os_str(), rfs::CWD, to.as_os_str()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Kind;
    use std::time::Duration;

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("lw-maildir-{}", base::id::new_id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn msg() -> Message {
        Message {
            version: 1,
            id: base::id::new_id(),
            from: "a".into(),
            to: vec!["b".into()],
            kind: Kind::Status,
            subject: "s".into(),
            body: "b".into(),
            refs: vec![],
            in_reply_to: None,
            created: base::time::rfc3339(base::time::now()),
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
    fn first_deliveries_racing_to_create_the_maildir_all_land() {
        // Several posters find no tmp/ and create the Maildir at once: one
        // may see tmp/ made by another before that one has made new/.
        let d = tempdir();
        let (rounds, posters) = (200, 8);
        let mut failed = Vec::new();
        for r in 0..rounds {
            let md = Maildir::new(d.join(format!("box{r}")));
            let start = std::sync::Arc::new(std::sync::Barrier::new(posters));
            let ts: Vec<_> = (0..posters)
                .map(|p| {
                    let (md, start) = (md.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        md.deliver(&format!("m{p}"), b"x")
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            let errs: Vec<String> = ts
                .into_iter()
                .filter_map(|t| t.join().unwrap().err())
                .collect();
            if md.names(Sub::New).map(|n| n.len()).unwrap_or(0) + errs.len() != posters {
                failed.push(format!(
                    "round {r}: what the deliveries reported disagrees with new/"
                ));
            }
            failed.extend(errs);
        }
        println!(
            "{rounds} rounds of {posters} first deliveries: {} failed",
            failed.len()
        );
        let _ = std::fs::remove_dir_all(&d);
        assert!(failed.is_empty(), "{failed:#?}");
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
