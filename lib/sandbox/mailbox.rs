//! A sandbox's mail dir when the sandbox goes: what counts as unread, and
//! where it is kept.
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
//! and a copy shares no inode the sandbox could still write through.

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::layout::Root;
use crate::message::{self, Message};
use crate::visible::visible_line;

/// Why `path` is not a valid message, or Ok.
pub fn check(path: &Path) -> std::result::Result<Message, String> {
    let st = fs::symlink_metadata(path).map_err(|e| format!("cannot stat: {e}"))?;
    if !st.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if st.nlink() > 1 {
        return Err(format!("{} hard links; a message has one", st.nlink()));
    }
    if st.mode() & 0o7111 != 0 {
        return Err(format!(
            "mode {:o} has setuid, setgid, sticky or execute bits",
            st.mode() & 0o7777
        ));
    }
    if st.len() > message::MAX_FILE {
        return Err(format!(
            "{} bytes; the limit is {}",
            st.len(),
            message::MAX_FILE
        ));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| crate::id::is_valid(n))
        .ok_or("file name does not follow the id grammar")?;
    let bytes = read_bounded(path, message::MAX_FILE)?;
    let m = Message::parse(&bytes).map_err(|e| e.0)?;
    if m.id != name {
        return Err(format!("id '{}' inside does not match the file name", m.id));
    }
    Ok(m)
}

/// At most `max` bytes of the regular file `path`, never following it.
fn read_bounded(path: &Path, max: u64) -> std::result::Result<Vec<u8>, String> {
    let f = fs::File::options()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .map_err(|e| format!("cannot open: {e}"))?;
    let mut buf = Vec::new();
    f.take(max)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(buf)
}

/// What `new/` of a mail dir's inbox and outbox holds.
#[derive(Debug, Default)]
pub struct Unread {
    /// (`inbox` or `outbox`, path) of each valid message.
    pub messages: Vec<(&'static str, PathBuf)>,
    /// (path, reason) of everything else.
    pub junk: Vec<(PathBuf, String)>,
}

pub fn unread(boxdir: &Path) -> Unread {
    let mut u = Unread::default();
    for which in ["inbox", "outbox"] {
        let dir = boxdir.join(which).join("new");
        let Ok(rd) = fs::read_dir(&dir) else { continue };
        let mut paths: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            match check(&p) {
                Ok(_) => u.messages.push((which, p)),
                Err(why) => u.junk.push((p, why)),
            }
        }
    }
    u
}

fn mkdir_private(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| Error::io("cannot create", p, e))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::io("cannot set the mode of", p, e))
}

/// Copies at most `max` bytes of `from` into a new file `to` (mode 0600).
fn copy_bounded(from: &Path, to: &Path, max: u64) -> std::result::Result<u64, String> {
    let bytes = read_bounded(from, max)?;
    let mut f = fs::File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(|e| format!("cannot create '{}': {e}", to.display()))?;
    f.write_all(&bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("cannot write '{}': {e}", to.display()))?;
    Ok(bytes.len() as u64)
}

/// Copies what `boxdir` still holds to the root's archive; returns the
/// archive directory and the number of unread messages, or None when there
/// was nothing to keep.
pub fn archive(root: &Root, name: &str, boxdir: &Path) -> Result<Option<(PathBuf, usize)>> {
    let u = unread(boxdir);
    if u.messages.is_empty() && u.junk.is_empty() {
        return Ok(None);
    }
    let stamp = crate::time::rfc3339(crate::time::now()).replace(':', "");
    let dir = root.dir.join("archive").join(format!(
        "{name}.{stamp}.{:08x}",
        crate::id::random128() as u32
    ));
    mkdir_private(&root.dir.join("archive"))?;
    mkdir_private(&dir)?;
    for (which, p) in &u.messages {
        let to_dir = dir.join("unread").join(which);
        mkdir_private(&to_dir)?;
        let to = to_dir.join(p.file_name().expect("a listed entry has a name"));
        copy_bounded(p, &to, message::MAX_FILE).map_err(Error::data)?;
    }
    if !u.junk.is_empty() {
        let q = dir.join("quarantine");
        mkdir_private(&q)?;
        let mut reasons = String::new();
        for (i, (p, why)) in u.junk.iter().enumerate() {
            let shown =
                visible_line(&p.strip_prefix(boxdir).unwrap_or(p).to_string_lossy()).into_owned();
            let kept = match fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_file() => {
                    match copy_bounded(p, &q.join(format!("{i}")), message::MAX_FILE) {
                        Ok(n) => format!("kept as quarantine/{i} ({n} bytes)"),
                        Err(e) => format!("not kept: {}", visible_line(&e)),
                    }
                }
                _ => "not kept: not a regular file".to_string(),
            };
            reasons += &format!("{shown}: {}; {kept}\n", visible_line(why));
        }
        let r = q.join("REASONS");
        fs::write(&r, reasons).map_err(|e| Error::io("cannot write", &r, e))?;
    }
    Ok(Some((dir, u.messages.len())))
}
