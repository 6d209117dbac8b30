//! The archive of a volume's `outbox/new/`, read as it streams and
//! bounded (mailbox-spec.md, REMOTE ENGINES, "Bounded").
//!
//! Docker's archive API writes a sparse file whole, its holes as zeros,
//! and a Kubernetes archive is a `tar` run in the pod, which the sandbox
//! controls: five sparse 2 GiB files in `outbox/new/` used to make each
//! pass stream 10 GiB, and every other sandbox's mail waited for it.  So
//! the reader never reads past what a pass may carry:
//!
//! * An entry's header is read, never its data, before its size is known:
//!   an entry over the message-file limit (a sparse file says its
//!   apparent size, so its holes count) ends the read there ([`End::Over`]);
//!   the caller moves such entries aside inside the sandbox and reads once
//!   more.  Nothing of it crosses but its header.
//! * The entries' data read (carried, or skipped as junk) is at most the
//!   room the caller gives (what the sandbox may carry in a pass); an
//!   entry that does not fit ends the read ([`End::Full`]) and waits for
//!   the next pass.
//! * A file within the limit that holds a NUL byte is no message (a
//!   sparse one's holes read as zeros): it is junk, so the root never
//!   holds a hole expanded.
//! * The whole archive read, headers and padding too, is at most that room
//!   and [`HEADERS`]: a hostile `tar` that says more is cut there.
//!
//! Ending a read drops the pipe: the engine's side stops with a broken
//! pipe, which the caller expects, and no more of the archive crosses the
//! engine's connection (Docker's archive request is dropped; the
//! contract's default `copy_out`, Kubernetes', stops its `tar` exec and
//! kills the `tar`: crates/engine/src/tar_out.rs).

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use base::error::{Error, Exit, Result};
use mailbox::maildir::{Delivered, Maildir};
use mailbox::message;

/// What one sandbox's outbox may carry into the root in a pass, and what
/// the root holds of it waiting for the mediator: the default mail quota
/// (`sandbox.mail-disk`, lib/sandbox/limits.rs), which bounds a local
/// sandbox's outbox the same way.  A volume has no quota, so the courier
/// keeps it.
pub const PASS_MAX: u64 = 64 << 20;

/// What the headers and padding of one archive may take beyond its
/// entries' data.
pub const HEADERS: u64 = 1 << 20;

/// Why a read of the archive ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// At the archive's end: everything in it was seen.
    Whole,
    /// The next entry did not fit in the room left: it waits.
    Full,
    /// An entry over the message-file limit: nothing of it was read.
    Over,
}

/// What one read of the archive found.
#[derive(Debug)]
pub struct Read1 {
    /// Names delivered into the root (and whether this read delivered them).
    pub carried: Vec<(String, bool)>,
    /// Entries that are not messages: (name, why).
    pub junk: Vec<(String, String)>,
    pub end: End,
    /// Bytes of the archive read.
    pub bytes: u64,
}

/// A reader that counts what it reads and ends at `left`.
struct Counted<R> {
    inner: R,
    read: Rc<Cell<u64>>,
    left: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let max = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        self.left -= n as u64;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// Reads the archive of `outbox/new` from `reader` and delivers each
/// message into `target` (deliver-once), reading at most `room` bytes of
/// entries' data (and [`HEADERS`] more).
pub fn read_outbox(reader: impl Read, target: &Maildir, room: u64) -> Result<Read1> {
    let read = Rc::new(Cell::new(0));
    let cap = room.saturating_add(HEADERS);
    let counted = Counted {
        inner: reader,
        read: read.clone(),
        left: cap,
    };
    let mut a = tar::Archive::new(counted);
    let mut r = Read1 {
        carried: Vec::new(),
        junk: Vec::new(),
        end: End::Whole,
        bytes: 0,
    };
    // An archive that breaks off once the bound is read was cut by it,
    // not by the engine.
    let cut = |e: std::io::Error| {
        if read.get() >= cap {
            return Ok(End::Full);
        }
        Err(Error::new(
            Exit::Unavailable,
            format!("the engine's archive of the outbox is unreadable: {e}"),
        ))
    };
    let mut data = 0u64;
    match a.entries() {
        Ok(entries) => {
            for entry in entries {
                let step = match entry {
                    Ok(entry) => one(entry, target, room, &mut data, &mut r),
                    Err(e) => Err(Failed::Read(e)),
                };
                let end = match step {
                    Ok(None) => continue,
                    Ok(Some(end)) => end,
                    Err(Failed::Read(e)) => cut(e)?,
                    Err(Failed::Door(e)) => return Err(e),
                };
                r.end = end;
                break;
            }
        }
        Err(e) => r.end = cut(e)?,
    }
    if r.end == End::Whole {
        // tar pads its archive past the end marker (to its record size):
        // read it all (within the bound), so the engine's side is not cut
        // off mid-write.
        let _ = std::io::copy(&mut a.into_inner(), &mut std::io::sink());
    }
    r.bytes = read.get();
    Ok(r)
}

enum Failed {
    /// The archive could not be read.
    Read(std::io::Error),
    /// A message could not be delivered into the root.
    Door(Error),
}

/// Takes one entry of the archive: carried, counted as junk, or the end
/// of the read (over the limit, or past the room).  `data`: the entries'
/// data read so far.
fn one<R: Read>(
    mut entry: tar::Entry<R>,
    target: &Maildir,
    room: u64,
    data: &mut u64,
    r: &mut Read1,
) -> std::result::Result<Option<End>, Failed> {
    let path = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    let path = path.trim_end_matches('/');
    let size = entry.header().size().unwrap_or(u64::MAX);
    // `new` itself, and what a directory planted in new/ holds (moved
    // with it), are not messages.
    let name = path.strip_prefix("new/");
    // Nothing of an entry over the limit is read, wherever it is.
    if size > message::MAX_FILE {
        if let Some(name) = name {
            let top = name.split('/').next().unwrap_or(name);
            let why = format!("{size} bytes; the limit is {}", message::MAX_FILE);
            r.junk.push((top.to_string(), why));
        }
        return Ok(Some(End::Over));
    }
    if *data + size > room {
        return Ok(Some(End::Full));
    }
    *data += size;
    let Some(name) = name.filter(|n| !n.contains('/')) else {
        return Ok(None);
    };
    let why = if !entry.header().entry_type().is_file() {
        Some("not a regular file")
    } else if !base::id::is_valid(name) {
        Some("its name does not follow the id grammar")
    } else {
        None
    };
    if let Some(why) = why {
        r.junk.push((name.to_string(), why.to_string()));
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut bytes).map_err(Failed::Read)?;
    if bytes.contains(&0) {
        // No message holds a NUL byte (JSON has none outside escapes): a
        // sparse file's holes stay in the volume, never expanded here.
        let why = "it holds NUL bytes (a sparse file's holes, say)";
        r.junk.push((name.to_string(), why.to_string()));
        return Ok(None);
    }
    let new = target.deliver_once(name, &bytes).map_err(Failed::Door)?;
    r.carried
        .push((name.to_string(), matches!(new, Delivered::New(_))));
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive of `new/` with `files` (name, size, bytes written: a
    /// sparse file's are zeros), as Docker writes it.
    fn archive(files: &[(&str, u64)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o700);
        h.set_cksum();
        b.append_data(&mut h, "new/", std::io::empty()).unwrap();
        for (name, size) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(*size);
            h.set_mode(0o600);
            h.set_cksum();
            b.append_data(
                &mut h,
                format!("new/{name}"),
                std::io::repeat(b'{').take(*size),
            )
            .unwrap();
        }
        b.into_inner().unwrap()
    }

    fn id(n: u32) -> String {
        format!("1800000000.{n:09}.{:032x}", n)
    }

    fn target(tag: &str) -> Maildir {
        let d = std::env::temp_dir().join(format!("lw-outbox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        Maildir::new(d)
    }

    #[test]
    fn an_entry_over_the_limit_ends_the_read_before_its_data() {
        let big = id(2);
        let t = target("over");
        let a = archive(&[(&id(1), 100), (&big, 3 << 20), (&id(3), 100)]);
        let r = read_outbox(&a[..], &t, 64 << 20).unwrap();
        assert_eq!(r.end, End::Over);
        assert_eq!(r.carried, vec![(id(1), true)]);
        assert_eq!(r.junk.len(), 1);
        assert_eq!(r.junk[0].0, big);
        assert!(
            r.bytes < 64 << 10,
            "only headers past the first: {}",
            r.bytes
        );
        let _ = std::fs::remove_dir_all(&t.path);
    }

    #[test]
    fn a_file_with_holes_within_the_limit_is_junk_and_never_delivered() {
        let t = target("holes");
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(1 << 20);
        h.set_mode(0o600);
        h.set_cksum();
        b.append_data(
            &mut h,
            format!("new/{}", id(1)),
            std::io::repeat(0).take(1 << 20),
        )
        .unwrap();
        let a = b.into_inner().unwrap();
        let r = read_outbox(&a[..], &t, 64 << 20).unwrap();
        assert_eq!(r.end, End::Whole);
        assert!(r.carried.is_empty() && r.junk.len() == 1, "{r:?}");
        assert!(!t.sub(mailbox::maildir::Sub::New).join(id(1)).exists());
        let _ = std::fs::remove_dir_all(&t.path);
    }

    #[test]
    fn a_big_file_inside_a_planted_directory_names_the_directory() {
        let t = target("dir");
        let a = archive(&[("d/x", 2 << 20), (&id(1), 10)]);
        let r = read_outbox(&a[..], &t, 64 << 20).unwrap();
        assert_eq!(r.end, End::Over);
        assert_eq!(r.junk[0].0, "d", "the sweep moves d: {:?}", r.junk);
        assert!(r.carried.is_empty());
        let _ = std::fs::remove_dir_all(&t.path);
    }

    #[test]
    fn the_data_read_is_at_most_the_room() {
        let t = target("room");
        let files: Vec<(String, u64)> = (0..10).map(|n| (id(n), 1 << 20)).collect();
        let refs: Vec<(&str, u64)> = files.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        let a = archive(&refs);
        let r = read_outbox(&a[..], &t, 3 << 20).unwrap();
        assert_eq!(r.end, End::Full);
        assert_eq!(r.carried.len(), 3, "three of 1 MiB fit in 3 MiB");
        assert!(r.bytes <= (3 << 20) + HEADERS, "{}", r.bytes);
        let _ = std::fs::remove_dir_all(&t.path);
    }
}
