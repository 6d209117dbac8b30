//! The watch loop and the locks that keep one mediator per root.

use crate::layout::{self, Root};
use base::error::{Error, Exit, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::Mediator;

/// Takes the lock that keeps two mediators off one root.  Held until the
/// returned file is dropped (or the process dies).
pub fn lock_mediator(root: &Root) -> Result<std::fs::File> {
    let p = lock_path(root, "mediator.lock")?;
    base::fs::try_lock(&p)
        .map_err(|e| Error::lock(&p, e))?
        .ok_or_else(|| {
            Error::new(
                Exit::TempFail,
                format!(
                    "another lw-mediate is running on '{}' (lock '{}' is held)",
                    root.dir.display(),
                    p.display()
                ),
            )
        })
}

/// Raises this process's soft limit on open files to its hard limit: a pass
/// holds three descriptors for each outbox and inbox it touches (a thousand
/// sandboxes need some 6,000, more than the usual soft limit of 1,024).
pub fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

/// Takes the lock that serialises writers of inboxes and queues (a pass of
/// the mediator, an operator's release or drop); waits for it.
pub fn lock_routes(root: &Root) -> Result<std::fs::File> {
    let p = lock_path(root, "route.lock")?;
    base::fs::lock(&p).map_err(|e| Error::lock(&p, e))
}

pub(super) fn lock_path(root: &Root, name: &str) -> Result<PathBuf> {
    root.check_exists()?;
    let dir = root.state_dir();
    root.make_dir(&dir)
        .map_err(|e| Error::io("cannot create", &dir, e))?;
    Ok(dir.join(name))
}

impl Mediator {
    /// Watches the root and routes as things arrive, with a full pass every
    /// `rescan` as a safety net.  Returns only on error.
    pub fn watch(&mut self, rescan: Duration, out: &mut dyn Write) -> Result<()> {
        use base::fs::{Watcher, Woke};
        let watcher = Watcher::new().map_err(|e| Error::io("cannot watch", &self.root.dir, e))?;
        loop {
            // Watches first, then the pass: an arrival in between is seen by both.
            let mut dirs = vec![
                self.root.sandboxes_dir(),
                self.root.registry_dir(),
                self.root.human_outbox().sub(crate::maildir::Sub::New),
            ];
            for (s, rel) in self.outboxes() {
                dirs.push(self.root.dir.join(rel).join("new"));
                if s != layout::HUMAN && s != layout::MEDIATOR {
                    dirs.push(self.root.sandbox(&s).inbox().sub(crate::maildir::Sub::Cur));
                }
            }
            if let Some(parent) = self.policy_file.path.as_ref().and_then(|p| p.parent()) {
                dirs.push(if parent.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    parent.to_path_buf()
                });
            }
            for d in &dirs {
                // A directory that is missing or a planted link is not
                // watched; the periodic re-scan still covers it.
                let _ = watcher.add(d);
            }
            // A failing pass (a full disk, a removed directory) is reported
            // and tried again on the next event or re-scan; the watcher
            // does not exit over it.
            match self.pass(out) {
                // A recorded secret the door cannot resolve (78) does not
                // resolve by waiting: this process's environment is fixed.
                Err(e) if e.exit == base::error::Exit::Config => return Err(e),
                Err(e) => (self.report)(&format!("{e}; trying again")),
                Ok(_) => {}
            }
            out.flush().map_err(base::error::out_err)?;
            // The directories are the truth, not the events: any wake-up
            // (an arrival, an overflow, a removed directory) means a pass.
            match watcher.wait(Some(rescan)) {
                Ok(Woke::Timeout) => {
                    // Quiet: a good moment to save the rate memory.
                    self.save_memory()?;
                }
                Ok(Woke::Changed | Woke::Overflow | Woke::Gone(_)) => {}
                Err(e) => return Err(Error::io("cannot wait on", &self.root.dir, e)),
            }
        }
    }
}
