//! The mediator's durable memory on disk (`ROOT/state/mediator.json`):
//! loading and saving it, and counting the held queue at a pass.  What it
//! holds, and the queries and changes deciding makes of it, are pure:
//! pure/memory.rs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use super::inspect::{Inspected, inspect};
use super::pure::memory::Memory;
use super::{Boxes, HELD, Mediator, read_names};
use base::error::{Error, Result};

impl Mediator {
    fn memory_path(&self) -> PathBuf {
        self.root.state_dir().join("mediator.json")
    }

    pub(super) fn load_memory(&mut self) {
        let p = self.memory_path();
        let Ok(bytes) = std::fs::read(&p) else { return };
        match serde_json::from_slice::<Memory>(&bytes) {
            Ok(mut m) => {
                m.dup_index = m.dups.iter().cloned().collect();
                self.state.memory = m;
            }
            Err(e) => self.warn_once(format!("ignoring unreadable state '{}': {e}", p.display())),
        }
    }

    /// Writes the rate, duplicate and receipt memory (atomically: temporary
    /// file, fsync, rename).  Losing it costs only a forgotten window.
    pub fn save_memory(&mut self) -> Result<()> {
        if !self.state.memory.dirty {
            return Ok(());
        }
        self.state.memory.version = 1;
        let p = self.memory_path();
        let bytes = serde_json::to_vec(&self.state.memory)
            .expect("the state serialises because it is plain data");
        base::fs::write_replace(&p, &bytes, 0o600, base::fs::Durability::Synced)
            .map_err(|e| Error::io("cannot write state", &p, e))?;
        self.state.memory.dirty = false;
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
                if let Inspected::Message(m) = inspect(&held.new, &n, true, None) {
                    *count.entry(m.from).or_default() += 1;
                }
            }
        }
        let cap = self.policy.held_max.as_ref().map(|c| c.value);
        let memory = &mut self.state.memory;
        let before = memory.capped.len();
        memory
            .capped
            .retain(|s| cap.is_some_and(|c| count.get(s).copied().unwrap_or(0) >= c));
        if memory.capped.len() != before {
            memory.dirty = true;
        }
        self.state.held_count = count;
    }
}
