//! Errors carry the exit status they map to.
//!
//! Every command exits with a sysexits(3) code that its man page documents.
//! An error therefore knows its code from the moment it is made, and its text
//! follows the house form: what failed, the path in quotes, then the cause.

use std::fmt;
use std::io;
use std::path::Path;

/// Exit statuses, from sysexits(3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    Ok = 0,
    /// 64: the command was used incorrectly.
    Usage = 64,
    /// 65: the input data was incorrect (a message that fails validation).
    DataErr = 65,
    /// 66: an input file or message did not exist or was not readable.
    NoInput = 66,
    /// 69: a service is unavailable (Docker engine, remote repository, GitHub).
    Unavailable = 69,
    /// 70: an internal error.
    Software = 70,
    /// 73: an output file or directory cannot be created.
    CantCreat = 73,
    /// 74: an input/output error (disk full, failed fsync).
    IoErr = 74,
    /// 75: a temporary failure; the same call may succeed later (timeouts, locks).
    TempFail = 75,
    /// 77: permission denied.
    NoPerm = 77,
    /// 78: a configuration error.
    Config = 78,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// A library error: an exit status, a message and an optional cause.
#[derive(Debug)]
pub struct Error {
    pub exit: Exit,
    pub msg: String,
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(exit: Exit, msg: impl Into<String>) -> Self {
        Error {
            exit,
            msg: msg.into(),
            source: None,
        }
    }

    pub fn usage(msg: impl Into<String>) -> Self {
        Error::new(Exit::Usage, msg)
    }

    pub fn data(msg: impl Into<String>) -> Self {
        Error::new(Exit::DataErr, msg)
    }

    pub fn config(msg: impl Into<String>) -> Self {
        Error::new(Exit::Config, msg)
    }

    /// An I/O failure on `path`; the exit status follows the errno (see [`io_exit`]).
    pub fn io(what: &str, path: &Path, err: io::Error) -> Self {
        Error {
            exit: io_exit(&err),
            msg: format!("{what} '{}'", path.display()),
            source: Some(Box::new(err)),
        }
    }

    /// Same as [`Error::io`] with the exit status chosen by the caller.
    pub fn io_as(exit: Exit, what: &str, path: &Path, err: io::Error) -> Self {
        Error {
            exit,
            msg: format!("{what} '{}'", path.display()),
            source: Some(Box::new(err)),
        }
    }

    /// A failure of [`crate::fs::lock`] or [`crate::fs::try_lock`] on `path`:
    /// a lock file that cannot be opened is an I/O error (73/74, as
    /// [`Error::io`]); one that opens but cannot be locked is temporary (75).
    pub fn lock(path: &Path, err: io::Error) -> Self {
        match err.kind() {
            io::ErrorKind::NotFound
            | io::ErrorKind::PermissionDenied
            | io::ErrorKind::ReadOnlyFilesystem
            | io::ErrorKind::IsADirectory => Error::io("cannot open", path, err),
            _ => Error::io_as(Exit::TempFail, "cannot lock", path, err),
        }
    }

    pub fn with_source(mut self, err: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(err));
        self
    }
}

/// Converts a failed write to stdout into an error that `main_with` treats
/// as a closed pipe when it is one.
pub fn out_err(e: io::Error) -> Error {
    Error::new(Exit::IoErr, "cannot write to standard output").with_source(e)
}

/// A rustix errno as a std I/O error (for messages and [`io_exit`]).
pub fn errno_io(e: rustix::io::Errno) -> io::Error {
    e.into()
}

/// The exit status for an I/O error: missing or forbidden places are 73
/// (cannot create), everything else (ENOSPC, EIO, ...) is 74.
pub fn io_exit(err: &io::Error) -> Exit {
    match err.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::PermissionDenied
        | io::ErrorKind::ReadOnlyFilesystem => Exit::CantCreat,
        _ => Exit::IoErr,
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if let Some(src) = &self.source {
            let text = src.to_string();
            // io::Error adds " (os error N)"; the errno name is enough.
            let text = match text.find(" (os error ") {
                Some(i) => &text[..i],
                None => &text,
            };
            write!(f, ": {text}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// A JSON document that does not parse (a log entry, a record, a reply):
/// bad data, not a failing system.
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Error {
        Error::new(Exit::DataErr, "invalid JSON").with_source(e)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        io::Error::other(e.to_string())
    }
}
