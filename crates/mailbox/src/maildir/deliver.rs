//! Delivery into a Maildir (mailbox-spec.md, "DELIVERY"): `tmp/NAME`
//! created exclusively, written and synced, renamed into `new/` without
//! replacing, `new/` synced; once-only delivery across claims.

use super::*;

impl Maildir {
    /// Delivers `bytes` as `new/NAME` by the delivery procedure.  The
    /// directories are created on first use when the Maildir's parent exists.
    pub fn deliver(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let open = |s: Sub| open_dir(&self.sub(s)).map_err(|e| (s, e));
        let both = || Ok::<_, (Sub, Errno)>((open(Sub::Tmp)?, open(Sub::New)?));
        // Either one missing means creating: posters that race to a fresh
        // Maildir can see tmp/ made by another before it has made new/.
        let (tmp, new) = match both() {
            Err((_, Errno::NOENT)) => {
                self.create_checked()?;
                both()
            }
            other => other,
        }
        .map_err(|(s, e)| Error::io("cannot open", &self.sub(s), errno_io(e)))?;
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
        let ours = rfs::fstat(&fd).map(|st| (st.st_dev, st.st_ino)).ok();
        drop(fd);
        let new_path = self.sub(Sub::New).join(name);
        let moved = base::fs::rename_noreplace_at(tmp, OsStr::new(name), new, OsStr::new(name))
            .or_else(|e| {
                // Where the move is link + unlink (gVisor), the link is the
                // publication: once new/NAME is this very file, a failed
                // unlink of the tmp name (a mediator that finished the move
                // first) must not report a message a reader may already
                // have taken as not sent.  A watching mediator may even
                // have taken it out of new/ already: then the tmp name is
                // gone too (only this call made it, and the mediator
                // removes it only once new/NAME is the same file), and
                // gVisor has answered ENOENT for a move that happened.
                let stat = |dir| {
                    rfs::statat(dir, name, rfs::AtFlags::SYMLINK_NOFOLLOW)
                        .map(|st| (st.st_dev, st.st_ino))
                };
                let published = match stat(new) {
                    Ok(there) => Some(there) == ours,
                    Err(_) => e == Errno::NOENT && stat(tmp) == Err(Errno::NOENT),
                };
                if ours.is_some() && published {
                    Ok(())
                } else {
                    Err(e)
                }
            });
        moved.map_err(|e| {
            cleanup(Error::io_as(
                if e == Errno::EXIST {
                    Exit::Software
                } else {
                    base::error::io_exit(&errno_io(e))
                },
                "cannot move message into",
                &new_path,
                errno_io(e),
            ))
        })?;
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
}
