//! Batch files: many log entries in one file of `log/new/`
//! (mailbox-spec.md, "THE LOG"), and the index that finds an entry by name.
//!
//! A batch file is named `batch.ID` (an entry's name starts with a message
//! id, a digit, so the two never meet) and holds entries one per line, each
//! line an entry's JSON as an entry file holds it.  It is written whole in
//! `tmp/`, fsynced, then renamed into `new/`, whose fsync makes every entry
//! in it durable at once: one file and one fsync per batch, not per entry.
//! Each line is read on its own: a line that is not an entry (garbled, or
//! cut short with no newline) costs that line only.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::hash::BuildHasher;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{self as rfs, Mode, OFlags};

use super::Entry;

/// The start of every batch file's name.
pub const BATCH_PREFIX: &str = "batch.";

/// True for the name of a batch file (not an entry file).
pub fn is_batch(name: &OsStr) -> bool {
    name.as_bytes().starts_with(BATCH_PREFIX.as_bytes())
}

/// A new batch file's name.
pub fn batch_name() -> String {
    format!("{BATCH_PREFIX}{}", base::id::new_id())
}

/// The most a batch file may hold: the mediator's largest batch of the
/// largest entries (anything larger is not one the door wrote).
pub const MAX_BATCH_FILE: u64 = 8 * 1024 * 2 * crate::message::MAX_FILE;

/// One line of a batch file: where it is, and the entry or why not.
pub struct Line {
    pub number: usize,
    pub off: u64,
    pub len: u32,
    pub entry: std::result::Result<Entry, String>,
}

/// The lines of a batch file.  A last line without its newline is cut
/// short (never written so by the door, which fsyncs the whole file before
/// it is visible): reported, like a garbled one, and the others kept.
pub fn parse(bytes: &[u8]) -> Vec<Line> {
    let mut out = Vec::new();
    let mut off = 0usize;
    let mut number = 0;
    while off < bytes.len() {
        number += 1;
        let (end, whole) = match bytes[off..].iter().position(|b| *b == b'\n') {
            Some(i) => (off + i + 1, true),
            None => (bytes.len(), false),
        };
        let line = &bytes[off..end];
        let entry = if !whole {
            Err("cut short (no newline at the end of the batch file)".to_string())
        } else if line.len() as u64 > 2 * crate::message::MAX_FILE {
            Err("larger than any entry loopwright writes".to_string())
        } else {
            Entry::parse(line)
        };
        out.push(Line {
            number,
            off: off as u64,
            len: line.len() as u32,
            entry,
        });
        off = end;
    }
    out
}

/// The bytes of a batch file holding `entries`, and each entry's place.
pub fn encode(entries: &[&Entry]) -> (Vec<u8>, Vec<(String, u64, u32)>) {
    let mut bytes = Vec::new();
    let mut places = Vec::with_capacity(entries.len());
    for e in entries {
        let b = e.to_bytes();
        places.push((e.name.clone(), bytes.len() as u64, b.len() as u32));
        bytes.extend_from_slice(&b);
    }
    (bytes, places)
}

/// Reads a regular file of the directory open as `dir` (never through a
/// link, never waiting on a FIFO), at most `max` bytes, or why not.
pub fn read_file_in(dir: &impl AsFd, name: &OsStr, max: u64) -> Result<Vec<u8>, String> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd =
        rfs::openat(dir, name, flags, Mode::empty()).map_err(|e| format!("cannot open: {e}"))?;
    let st = rfs::fstat(&fd).map_err(|e| format!("cannot stat: {e}"))?;
    if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::RegularFile {
        return Err("not a regular file".into());
    }
    let len = st.st_size as u64;
    if len > max {
        return Err(format!(
            "{len} bytes; larger than any file loopwright writes there"
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    Ok(bytes)
}

/// Where an indexed entry is.
#[derive(Clone, Copy, Debug)]
enum Loc {
    /// In a file of its own, named as the entry (the one-entry layout).
    Own,
    /// A line of batch file `file` (an index into [`Index::files`]).
    In { file: u32, off: u64, len: u32 },
}

/// Every entry name of `log/new/` and where its entry is: 16 bytes of key
/// and 24 of place per entry (48 to 96 bytes with the table's slack, as it
/// doubles), plus each batch file's name.  Keys are two
/// hashes of the name under keys chosen at random per process, so no
/// writer can make two names meet; a read checks the entry's name anyway.
#[derive(Default)]
pub struct Index {
    hashers: (
        std::collections::hash_map::RandomState,
        std::collections::hash_map::RandomState,
    ),
    map: HashMap<(u64, u64), Loc>,
    files: Vec<OsString>,
    /// Batch files read (or written) already.
    seen: HashSet<OsString>,
    /// `new/`'s modification time when last listed.
    stamp: Option<(i64, i64)>,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Index({} entries, {} batch files)",
            self.map.len(),
            self.files.len()
        )
    }
}

impl Index {
    fn key(&self, name: &str) -> (u64, u64) {
        (self.hashers.0.hash_one(name), self.hashers.1.hash_one(name))
    }

    /// Entries indexed.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds what `new/` (open as `dir`) holds that is not indexed yet: the
    /// names of entry files, the lines of batch files not read before.
    /// Nothing is read when `new/` did not change since the last look.
    pub fn refresh(&mut self, dir: &impl AsFd) -> rustix::io::Result<()> {
        let st = rfs::fstat(dir)?;
        let stamp = (st.st_mtime, st.st_mtime_nsec as i64);
        let now = base::time::now();
        // A change within the timestamp granularity of the last look could
        // hide behind an equal stamp: look again then.
        let settled = now.as_secs() as i64 > stamp.0 + 2;
        if self.stamp == Some(stamp) && settled {
            return Ok(());
        }
        let rd = rfs::Dir::read_from(dir)?;
        for ent in rd {
            let ent = ent?;
            let n = OsStr::from_bytes(ent.file_name().to_bytes());
            if n.as_bytes().starts_with(b".") {
                continue;
            }
            if is_batch(n) {
                if !self.seen.contains(n) {
                    self.read_batch(dir, n);
                }
            } else if let Some(s) = n.to_str() {
                let k = self.key(s);
                self.map.entry(k).or_insert(Loc::Own);
            }
        }
        self.stamp = Some(stamp);
        Ok(())
    }

    /// Indexes the readable lines of batch file `n`.  A file that cannot
    /// be read now is looked at again on the next change of `new/`.
    fn read_batch(&mut self, dir: &impl AsFd, n: &OsStr) {
        let Ok(bytes) = read_file_in(dir, n, MAX_BATCH_FILE) else {
            return;
        };
        let places: Vec<(String, u64, u32)> = parse(&bytes)
            .into_iter()
            .filter_map(|l| Some((l.entry.ok()?.name, l.off, l.len)))
            .collect();
        self.add_file(n, &places);
    }

    /// Indexes batch file `n` whose entries are at `places` (name, offset,
    /// length): the mediator adds the files it writes without reading them.
    pub fn add_file(&mut self, n: &OsStr, places: &[(String, u64, u32)]) {
        let file = self.files.len() as u32;
        self.files.push(n.to_owned());
        self.seen.insert(n.to_owned());
        for (name, off, len) in places {
            let k = self.key(name);
            let (off, len) = (*off, *len);
            self.map.entry(k).or_insert(Loc::In { file, off, len });
        }
    }

    /// True when an entry of that name is indexed.
    pub fn has(&self, name: &str) -> bool {
        self.map.contains_key(&self.key(name))
    }

    /// Entry `name` from `new/` open as `dir`: None when not indexed, else
    /// the entry or why it cannot be read.
    pub fn read(&self, dir: &impl AsFd, name: &str) -> Option<std::result::Result<Entry, String>> {
        let loc = *self.map.get(&self.key(name))?;
        Some(
            match loc {
                Loc::Own => read_file_in(dir, OsStr::new(name), 2 * crate::message::MAX_FILE)
                    .and_then(|b| Entry::parse(&b)),
                Loc::In { file, off, len } => read_line(dir, &self.files[file as usize], off, len),
            }
            .and_then(|e| {
                if e.name == name {
                    Ok(e)
                } else {
                    Err(format!("the index points at entry '{}'", e.name))
                }
            }),
        )
    }
}

/// The entry at `off` (`len` bytes) of batch file `file`.
fn read_line(
    dir: &impl AsFd,
    file: &OsStr,
    off: u64,
    len: u32,
) -> std::result::Result<Entry, String> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd =
        rfs::openat(dir, file, flags, Mode::empty()).map_err(|e| format!("cannot open: {e}"))?;
    let mut buf = vec![0u8; len as usize];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::pread(&fd, &mut buf[got..], off + got as u64) {
            Ok(0) => return Err("batch file shorter than indexed".into()),
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("cannot read: {e}")),
        }
    }
    Entry::parse(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> Entry {
        crate::log::Notice {
            id: base::id::id_at(std::time::Duration::from_secs(1_800_000_000), n.into()),
            to: vec![crate::layout::HUMAN.into()],
            subject: format!("s{n}"),
            body: "b\n".into(),
            at: base::time::now(),
            reason: "r".into(),
        }
        .entry()
    }

    #[test]
    fn a_bad_line_costs_itself_only() {
        let (a, b) = (entry(1), entry(2));
        let (bytes, places) = encode(&[&a, &b]);
        let mut text = bytes.clone();
        text.extend_from_slice(b"{\"version\":1,garbage\n\n");
        text.extend_from_slice(&bytes[..bytes.len() / 3]);
        let lines = parse(&text);
        let got: Vec<_> = lines
            .iter()
            .map(|l| l.entry.clone().map(|e| e.name))
            .collect();
        assert_eq!(got[0], Ok(a.name.clone()));
        assert_eq!(got[1], Ok(b.name.clone()));
        assert!(
            got[2]
                .as_ref()
                .is_err_and(|e| e.contains("not a log entry"))
        );
        assert!(got[3].is_err(), "an empty line is not an entry");
        assert!(got[4].as_ref().is_err_and(|e| e.contains("cut short")));
        assert_eq!(lines.len(), 5);
        assert_eq!((lines[1].off, lines[1].len), (places[1].1, places[1].2));
    }

    #[test]
    fn the_index_finds_entries_of_both_layouts_and_not_others() {
        let d = std::env::temp_dir().join(format!("lw-logbatch-{}", base::id::new_id()));
        let log = crate::log::Log::new(&d);
        log.create().unwrap();
        let (a, b, c) = (entry(1), entry(2), entry(3));
        let (bytes, _) = encode(&[&a, &b]);
        std::fs::write(d.join("new").join(batch_name()), bytes).unwrap();
        assert!(log.append(&c).unwrap(), "an entry file, as before");
        let new = base::fs::open_dir_no_links(&d.join("new")).unwrap();
        let mut ix = Index::default();
        ix.refresh(&new).unwrap();
        for e in [&a, &b, &c] {
            assert!(ix.has(&e.name));
            assert_eq!(ix.read(&new, &e.name), Some(Ok(e.clone())));
            assert_eq!(log.read(OsStr::new(&e.name)), Ok(e.clone()));
            assert!(log.has(&e.name));
        }
        assert!(!ix.has("1.forward") && ix.read(&new, "1.forward").is_none());
        assert!(!log.has("1.forward"));
        let (good, bad) = log.entries().unwrap();
        assert_eq!(good.len(), 3);
        assert!(bad.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
