//! The directory tree of a mailbox root (mailbox-spec.md, "THE TREE").
//!
//! ```text
//! ROOT/
//!   sandboxes/NAME/outbox/{tmp,new,cur}   what NAME posts (lw-post)
//!   sandboxes/NAME/inbox/{tmp,new,cur}    what the mediator delivers to NAME (lw-inbox)
//!   human/{tmp,new,cur}                   questions escalated to a person
//!   human-outbox/{tmp,new,cur}            what a person answers (lw-mediate answer, lw-sync pull);
//!                                         the mediator routes it like a sandbox outbox, sender `human`
//!   mediator-outbox/{tmp,new,cur}         the mediator's own generated messages (lw-radar);
//!                                         routed like an outbox, sender `mediator`
//!   held/{tmp,new,cur}                    messages the policy held
//!   quarantine/{tmp,new,cur}              files that could not be read, with reasons
//!   log/{tmp,new}                         logged events: batch files, entry files
//!   registry/NAME.json                    the known sandboxes
//!   state/                                mediator and sync state, lock files
//! ```
//!
//! The root, `sandboxes/` and `state/` are mode 0700 and the records in
//! `state/` 0600; `registry/` is 0755 with 0644 records, readable by the
//! sandboxes' user through their read-only mount of it and by nobody else
//! past the closed root.
//!
//! A sandbox sees only `sandboxes/NAME` (mounted as its `LW_MAILBOX`), which is
//! why lw-post and lw-inbox take that directory and not the root.

use std::path::{Path, PathBuf};

use crate::maildir::Maildir;
use base::error::{Error, Exit, Result};

/// Reserved recipient names: the mediator itself and the human queue.
pub use base::id::{HUMAN, MEDIATOR};

/// The mailbox of one sandbox: the directory holding its `outbox/` and `inbox/`.
#[derive(Clone, Debug)]
pub struct SandboxBox {
    pub dir: PathBuf,
}

impl SandboxBox {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        SandboxBox { dir: dir.into() }
    }
    pub fn outbox(&self) -> Maildir {
        Maildir::new(self.dir.join("outbox"))
    }
    pub fn inbox(&self) -> Maildir {
        Maildir::new(self.dir.join("inbox"))
    }
}

/// A mailbox root as the mediator sees it.
#[derive(Clone, Debug)]
pub struct Root {
    pub dir: PathBuf,
}

impl Root {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Root { dir: dir.into() }
    }

    /// The root a command works on: `--root`, else `$LW_ROOT`, made
    /// absolute (it ends up in container labels and bind mounts).
    pub fn resolve(flag: Option<&Path>) -> base::Result<Root> {
        let env = std::env::var_os("LW_ROOT").map(PathBuf::from);
        match flag.map(Path::to_path_buf).or(env) {
            Some(d) if !d.as_os_str().is_empty() => {
                Ok(Root::new(std::path::absolute(&d).unwrap_or(d)))
            }
            _ => Err(base::Error::usage(
                "no mailbox root: pass --root DIR or set LW_ROOT",
            )),
        }
    }
    pub fn sandboxes_dir(&self) -> PathBuf {
        self.dir.join("sandboxes")
    }
    pub fn sandbox(&self, name: &str) -> SandboxBox {
        SandboxBox::new(self.sandboxes_dir().join(name))
    }
    pub fn human(&self) -> Maildir {
        Maildir::new(self.dir.join("human"))
    }
    /// Where a person's answers are posted; the mediator reads it as the outbox of `human`.
    pub fn human_outbox(&self) -> Maildir {
        Maildir::new(self.dir.join("human-outbox"))
    }
    /// Where the mediator's own generated messages wait to be routed (the
    /// radar's `conflict` and `conflict-cleared`); the mediator reads it as
    /// the outbox of `mediator`.  Only host commands write it.
    pub fn mediator_outbox(&self) -> Maildir {
        Maildir::new(self.dir.join("mediator-outbox"))
    }
    pub fn held(&self) -> Maildir {
        Maildir::new(self.dir.join("held"))
    }
    pub fn quarantine(&self) -> Maildir {
        Maildir::new(self.dir.join("quarantine"))
    }
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }
    pub fn registry_dir(&self) -> PathBuf {
        self.dir.join("registry")
    }
    /// Fails with 66 and the way out when the root directory is missing.
    pub fn check_exists(&self) -> Result<()> {
        if !self.dir.is_dir() {
            return Err(Error::new(
                Exit::NoInput,
                format!(
                    "mailbox root '{}' does not exist; create it or pass --root (or set LW_ROOT)",
                    self.dir.display()
                ),
            ));
        }
        Ok(())
    }

    /// Makes `dir`, the root or a directory in it, with whatever is missing
    /// between them: the root and each directory made in it mode 0700 (the
    /// root's own parents as usual).  Existing ones keep their mode: `lw
    /// doctor` fails one open to others.
    pub fn make_dir(&self, dir: &Path) -> std::io::Result<()> {
        if dir.is_dir() {
            return Ok(());
        }
        if !self.dir.exists()
            && let Some(parent) = self.dir.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        base::fs::private_dir(&self.dir)?;
        base::fs::private_dir(dir)
    }

    /// Creates the directories and Maildirs a root holds (mailbox-spec.md,
    /// "The tree"); those already there are kept.  The root itself must exist.
    /// `sandboxes/` and `state/` are closed (0700); `registry/` is 0755, its
    /// records 0644, because each sandbox's user reads it through its own
    /// read-only mount (`LW_REGISTRY`), which the closed root does not hinder.
    pub fn init(&self) -> Result<()> {
        self.check_exists()?;
        for d in [self.sandboxes_dir(), self.state_dir()] {
            self.make_dir(&d)
                .map_err(|e| Error::io("cannot create", &d, e))?;
        }
        make_registry_dir(&self.registry_dir())?;
        for m in [
            self.human(),
            self.human_outbox(),
            self.mediator_outbox(),
            self.held(),
            self.quarantine(),
            Maildir::new(self.log_dir()),
        ] {
            m.create()?;
        }
        Ok(())
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// Makes the registry directory, mode 0755 whatever the umask, when it is
/// missing (see [`Root::init`]).
pub fn make_registry_dir(d: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::create_dir(d) {
        Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| Error::io("cannot set the mode of", d, e)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io("cannot create", d, e)),
    }
}

/// Sandbox names are validated where ids are (crates/base/src/id.rs), so that message
/// parsing needs nothing from the root's layout.
pub use base::id::valid_name;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_names() {
        for ok in ["a", "api-1", "front.end", "x_y", "0"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "-a",
            ".a",
            "a/b",
            "a..b",
            "a:b",
            "a b",
            &"x".repeat(64),
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
