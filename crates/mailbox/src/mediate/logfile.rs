//! The mediator's side of batch files (crates/mailbox/src/log/batch.rs):
//! a batch's entries written as one file, and the index its "is it
//! logged" lookups go through.

use std::collections::HashSet;
use std::ffi::OsStr;

use crate::batch::Batch;
use crate::log::Entry;
use crate::log::batch::{self as logbatch};
use base::error::{Error, Result, errno_io};

use super::{Boxes, LOG, Mediator};

/// A batch file about to be written: its name, bytes, each entry's place
/// in it, and which entries (indexes into the caller's list) it holds.
pub(super) struct LogFile {
    pub name: String,
    pub bytes: Vec<u8>,
    pub places: Vec<(String, u64, u32)>,
    pub entries: Vec<usize>,
}

impl LogFile {
    pub(super) fn of(list: &[&Entry], entries: Vec<usize>) -> LogFile {
        let (bytes, places) = logbatch::encode(list);
        LogFile {
            name: logbatch::batch_name(),
            bytes,
            places,
            entries,
        }
    }
}

impl Mediator {
    /// Brings the index up to date with `log/new/` (entries others logged,
    /// a log the one-entry-per-file mediator wrote).
    pub(super) fn refresh_index(&mut self) -> Result<()> {
        self.index
            .refresh(&self.log_new)
            .map_err(|e| Error::io("cannot read", &self.root.log_dir().join("new"), errno_io(e)))
    }

    /// The entries of `list` not logged yet, each name once.
    pub(super) fn unlogged<'a>(&self, list: impl Iterator<Item = &'a Entry>) -> Vec<&'a Entry> {
        let mut fresh = HashSet::new();
        list.filter(|e| !self.index.has(&e.name) && fresh.insert(e.name.as_str()))
            .collect()
    }

    /// Logs `entries` (none of them logged yet) as one batch file, durable
    /// and visible when this returns, and indexes them.
    pub(super) fn commit_log_file(&mut self, boxes: &Boxes, entries: &[&Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let f = LogFile::of(entries, vec![]);
        let mut g = Batch::with_sync(self.sync);
        g.stage(&boxes.list, LOG, &f.name, &f.bytes)?;
        g.commit(&boxes.list)?;
        self.index.add_file(OsStr::new(&f.name), &f.places);
        Ok(())
    }
}
