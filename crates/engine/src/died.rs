//! How a container ended, in `ls`'s words, and the error an exec returns
//! when its container dies under it.
//!
//! An engine does not always end an exec's stream when the container
//! dies: under gVisor a dead sandbox kernel leaves Docker's stream open
//! for ever.  So an engine's exec watches its container as well and, when
//! the container ends first, returns 69 with a [`Died`] as the error's
//! source; [`died`] finds it, so that a caller can say what the container
//! was to it (lw-sandbox names the sandbox).

use std::fmt;
use std::time::Duration;

use base::error::{Error, Exit};

/// How long output still in flight is read once the container is dead
/// (under runsc Docker's stream never ends by itself).
pub(crate) const DRAIN: Duration = Duration::from_millis(300);

/// How long the container's death may come after the end of an exec that
/// SIGKILL ended (under runc, what the container's death does to it: the
/// engine may file the exec's end before the container's).
pub(crate) const KILLED: Duration = Duration::from_secs(1);
/// How long an exec the runtime itself failed (status 128) waits for its
/// container's death to be filed: within the 5 s lw-sandbox(1) promises.
pub(crate) const RUNTIME_FAILED: Duration = Duration::from_secs(4);

/// How often the container is asked about when the engine cannot be asked
/// to tell (its wait or watch failed).
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// How a stopped container ended, as `ls` says it: `exited` (status 0,
/// what a stop leaves), `exited (N)` (its main process, or gVisor's
/// kernel, ended with status N) or `exited (OOM)` (killed at its memory
/// limit).
pub fn exit_state(code: Option<i64>, oom_killed: bool) -> String {
    match code {
        _ if oom_killed => "exited (OOM)".into(),
        Some(0) | None => "exited".into(),
        Some(n) => format!("exited ({n})"),
    }
}

/// A container that ended while an exec ran in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Died {
    /// The container, as the exec named it.
    pub container: String,
    /// The command that ran, its words joined by spaces.
    pub cmd: String,
    /// Its exit status, `None` when the engine did not say.
    pub code: Option<i64>,
    /// The kernel's OOM killer ended it at its memory limit.
    pub oom_killed: bool,
    /// It was removed, not only stopped.
    pub removed: bool,
    /// The OCI runtime it ran under (`runc`, `runsc`), empty when unknown.
    pub runtime: String,
    /// The engine's own word on it (Docker's `State.Error`), often empty.
    pub error: String,
    /// When it ended, RFC 3339, as the engine says (empty when unknown).
    pub finished: String,
}

impl Died {
    /// `exited (OOM)`, `exited (2)`, `exited`, `removed`.
    pub fn state(&self) -> String {
        if self.removed {
            "removed".into()
        } else {
            exit_state(self.code, self.oom_killed)
        }
    }

    /// Whether it ran under gVisor, whose kernel is a process of its own
    /// that a storm of processes at the pids limit can end.
    pub fn gvisor(&self) -> bool {
        super::Isolation::of(&self.runtime) == super::Isolation::Gvisor
    }

    /// The error an exec returns: 69, naming the container, its state and
    /// the command, with this as its source.
    pub fn into_error(self) -> Error {
        Error::new(
            Exit::Unavailable,
            format!(
                "container '{}' {} while '{}' ran in it",
                self.container,
                self.state(),
                self.cmd
            ),
        )
        .with_source(self)
    }
}

/// Why, in a few words: the source's text of the error.
impl fmt::Display for Died {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.removed {
            f.write_str("it was removed")?;
        } else if self.oom_killed {
            f.write_str(
                "its processes went over its memory limit and the kernel's OOM killer ended it",
            )?;
        } else {
            match self.code {
                Some(0) => f.write_str("it was stopped")?,
                Some(n) if n > 128 => write!(f, "it was killed (signal {})", n - 128)?,
                Some(n) if self.gvisor() => write!(
                    f,
                    "gVisor's kernel ({}) ended with status {n}",
                    self.runtime
                )?,
                Some(n) => write!(f, "its main process ended with status {n}")?,
                None => f.write_str("it is no longer running")?,
            }
        }
        if !self.error.is_empty() {
            write!(f, " (the engine says: {})", self.error)?;
        }
        Ok(())
    }
}

impl std::error::Error for Died {}

/// The [`Died`] behind an exec's error, if its container ended under it.
pub fn died(e: &Error) -> Option<&Died> {
    e.source.as_deref()?.downcast_ref::<Died>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_as_ls_says_them() {
        assert_eq!(exit_state(Some(0), false), "exited");
        assert_eq!(exit_state(None, false), "exited");
        assert_eq!(exit_state(Some(2), false), "exited (2)");
        assert_eq!(exit_state(Some(137), true), "exited (OOM)");
        let removed = Died {
            removed: true,
            ..Default::default()
        };
        assert_eq!(removed.state(), "removed");
    }

    #[test]
    fn an_exec_whose_container_died_is_69_and_found_again() {
        let d = Died {
            container: "lw-sb-x-a".into(),
            cmd: "sh -c f".into(),
            code: Some(137),
            oom_killed: true,
            runtime: "runsc".into(),
            ..Default::default()
        };
        let e = d.clone().into_error();
        assert_eq!(e.exit, Exit::Unavailable);
        assert_eq!(
            e.to_string(),
            "container 'lw-sb-x-a' exited (OOM) while 'sh -c f' ran in it: its processes went \
             over its memory limit and the kernel's OOM killer ended it"
        );
        assert_eq!(died(&e), Some(&d));
        assert_eq!(died(&Error::new(Exit::Unavailable, "x")), None);
        let sentry = Died {
            code: Some(2),
            oom_killed: false,
            error: "x".into(),
            ..d
        };
        assert_eq!(
            sentry.to_string(),
            "gVisor's kernel (runsc) ended with status 2 (the engine says: x)"
        );
        let killed = Died {
            code: Some(137),
            error: String::new(),
            ..sentry
        };
        assert_eq!(killed.to_string(), "it was killed (signal 9)");
    }
}
