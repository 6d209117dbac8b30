//! The mediator's durable memory (`ROOT/state/mediator.json`): rate and
//! duplicate windows, receipts, held counts.  Losing it costs only a
//! forgotten window.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use super::*;

impl Mediator {
    pub(super) fn memory_path(&self) -> PathBuf {
        self.root.state_dir().join("mediator.json")
    }

    pub(super) fn load_memory(&mut self) {
        let p = self.memory_path();
        let Ok(bytes) = std::fs::read(&p) else { return };
        match serde_json::from_slice::<Memory>(&bytes) {
            Ok(mut m) => {
                m.dup_index = m.dups.iter().cloned().collect();
                self.memory = m;
            }
            Err(e) => self.warn_once(format!("ignoring unreadable state '{}': {e}", p.display())),
        }
    }

    /// Writes the rate, duplicate and receipt memory (atomically: temporary
    /// file, fsync, rename).  Losing it costs only a forgotten window.
    pub fn save_memory(&mut self) -> Result<()> {
        if !self.memory_dirty {
            return Ok(());
        }
        self.memory.version = 1;
        let p = self.memory_path();
        let bytes = serde_json::to_vec(&self.memory)
            .expect("the state serialises because it is plain data");
        crate::fs::write_replace(&p, &bytes, 0o600, crate::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write state", &p, e))?;
        self.memory_dirty = false;
        self.last_save = Instant::now();
        Ok(())
    }

    /// Counts the held queue by sender, and forgets the senders told about
    /// the cap who are below it again.
    pub(super) fn count_held(&mut self, boxes: &Boxes) {
        let held = &boxes.list[HELD];
        let mut count: HashMap<String, u32> = HashMap::new();
        // Without a cap nothing needs the counts (and the queue may be long).
        let names = match self.policy.held_max {
            Some(_) => read_names(&held.new),
            None => Ok(vec![]),
        };
        if let Ok(names) = names {
            for n in names {
                if let Inspected::Message(m) = inspect(&held.new, &n, true) {
                    *count.entry(m.from).or_default() += 1;
                }
            }
        }
        let cap = self.policy.held_max.as_ref().map(|c| c.value);
        let before = self.memory.capped.len();
        self.memory
            .capped
            .retain(|s| cap.is_some_and(|c| count.get(s).copied().unwrap_or(0) >= c));
        if self.memory.capped.len() != before {
            self.memory_dirty = true;
        }
        self.held_count = count;
    }

    /// Whether the entry of quarantine id `qid` was left for good.
    pub(super) fn is_left(&self, qid: &str) -> bool {
        self.memory.left.iter().any(|q| q == qid)
    }

    /// Remembers that the entry of quarantine id `qid` is left for good,
    /// durably at the next save.
    pub(super) fn leave(&mut self, qid: &str) {
        if !self.is_left(qid) {
            self.memory.left.push_back(qid.to_string());
            while self.memory.left.len() > MAX_REMEMBERED {
                self.memory.left.pop_front();
            }
            self.memory_dirty = true;
        }
    }
}
