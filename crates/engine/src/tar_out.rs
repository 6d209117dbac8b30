//! The contract's default [`SandboxEngine::copy_out`]: `tar -c` in the
//! running container through [`SandboxEngine::exec_io`], its output written
//! to the caller's `out` as it comes.  The Kubernetes engine copies out this
//! way (Docker has its archive endpoint).
//!
//! Bounded by its reader.  The courier reads a volume's outbox through it
//! and stops at its bound (lib/sandbox/courier/outbox.rs); the copy used to
//! read the exec to its end after that, discarding, so five sparse 2 GiB
//! files made 10 GiB cross the connection each pass and another pair's mail
//! waited for it (#40).  Now the first write to `out` that fails stops the
//! exec ([`ExecIo::stop`]): the engine reads no more and closes the exec's
//! streams.  That alone does not end `tar`: Docker leaves an exec whose
//! attach connection closed running, blocked on its full pipe, for as long
//! as the container lives, and what a kubelet does depends on its runtime.
//! So `tar` is started by a shell that first writes its own pid as the
//! output's first line (`exec` keeps the pid; on stdout, so it cannot
//! arrive after the archive's first bytes), and a stopped copy kills that
//! pid in a second exec, as the same user, once it has checked that the
//! pid still runs this very `tar` command (`/proc/PID/cmdline`).
//!
//! Why not a bound inside the container instead (`tar | head -c N`)?  It
//! bounds the bytes but not the exec: a reader stops far before any N that
//! fits every use (at a 2 GiB entry's header), and a `head` that nobody
//! reads blocks just as `tar` does; and `copy_out` is not told an N.  The
//! stop asks of the container only `sh`, `tr` and `kill`, which a sandbox
//! image has anyway, and costs one more exec only when the reader stopped
//! early.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{ExecIo, ExecRequest, OutStream, STOPPED, SandboxEngine};
use base::error::{Error, Exit, Result};

/// Starts `tar` ($1 the directory, $2 the entry) after saying its pid.
const TAR: &str = "echo $$ && exec tar -c -f - -C \"$1\" -- \"$2\"";

/// Kills pid $1 when it still runs the command the other arguments spell
/// (a pid freed and taken again meanwhile is left alone).
const KILL: &str = "p=$1; shift
c=$(tr '\\0' ' ' 2>/dev/null <\"/proc/$p/cmdline\") || exit 0
[ \"$c\" = \"$* \" ] || exit 0
kill -KILL \"$p\" 2>/dev/null || :";

/// What `tar` may say on stderr before the copy is stopped: its errors are
/// a line per entry it could not read.
const ERR_MAX: usize = 64 << 10;

/// The pid line: digits and a newline.
const PID_MAX: usize = 24;

/// The default `copy_out` (lib.rs documents the contract).
pub(crate) fn copy_out<E: SandboxEngine + ?Sized>(
    engine: &E,
    container: &str,
    path: &str,
    out: &mut dyn Write,
) -> Result<u64> {
    let p = std::path::Path::new(path);
    let parent = p
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "/".into());
    let base = p
        .file_name()
        .map(|b| b.to_string_lossy().into_owned())
        .unwrap_or_else(|| ".".into());
    let user = engine.runs_as_root().then(|| "0".to_string());
    let req = ExecRequest {
        cmd: ["sh", "-c", TAR, "sh", &parent, &base]
            .map(String::from)
            .to_vec(),
        user: user.clone(),
        ..Default::default()
    };
    let stop = AtomicBool::new(false);
    let mut copy = Copy::new(out);
    let mut on = |s: OutStream, b: &[u8]| {
        if !copy.take(s, b) {
            stop.store(true, Ordering::Relaxed);
        }
    };
    let io = ExecIo {
        stdin: None,
        tty: false,
        size: None,
        on_output: &mut on,
        stop: Some(&stop),
    };
    let code = engine.exec_io(container, &req, io)?;
    let Copy {
        pid,
        written,
        err,
        failed,
        ..
    } = copy;
    if (stop.load(Ordering::Relaxed) || code == STOPPED)
        && let Some(pid) = pid
    {
        let tar = ["tar", "-c", "-f", "-", "-C", &parent, "--", &base];
        let mut cmd: Vec<String> = ["sh", "-c", KILL, "sh"].map(String::from).to_vec();
        cmd.push(pid.to_string());
        cmd.extend(tar.map(String::from));
        let kill = ExecRequest {
            cmd,
            user,
            ..Default::default()
        };
        // Best effort: a kill that cannot run leaves a `tar` that ends
        // with its container, and the copy's own error says more.
        let _ = engine.exec(container, &kill, &mut |_, _| {});
    }
    if let Some(why) = failed {
        return Err(Error::new(
            Exit::IoErr,
            format!("cannot write the archive of '{path}': {why}"),
        ));
    }
    ended(code, &err, container, path, &base).map(|()| written)
}

/// The exec's output as it arrives: the pid line, then the archive into
/// `out`, and what `tar` says on stderr.
struct Copy<'o> {
    out: &'o mut dyn Write,
    /// The pid line read so far (until its newline).
    line: Vec<u8>,
    pid: Option<u32>,
    written: u64,
    err: Vec<u8>,
    /// Why the copy stopped reading.
    failed: Option<String>,
}

impl<'o> Copy<'o> {
    fn new(out: &'o mut dyn Write) -> Copy<'o> {
        Copy {
            out,
            line: Vec::new(),
            pid: None,
            written: 0,
            err: Vec::new(),
            failed: None,
        }
    }

    /// Takes one chunk; false once the copy wants no more.
    fn take(&mut self, s: OutStream, mut b: &[u8]) -> bool {
        if self.failed.is_some() {
            return false;
        }
        if s == OutStream::Stderr {
            self.err.extend_from_slice(b);
            if self.err.len() > ERR_MAX {
                self.failed = Some(format!("tar wrote more than {ERR_MAX} bytes of errors"));
            }
            return self.failed.is_none();
        }
        if self.pid.is_none() {
            let nl = b.iter().position(|&c| c == b'\n');
            let (head, rest) = match nl {
                Some(i) => (&b[..i], &b[i + 1..]),
                None => (b, &[][..]),
            };
            self.line.extend_from_slice(head);
            b = rest;
            if nl.is_some() {
                match std::str::from_utf8(&self.line)
                    .ok()
                    .and_then(|l| l.parse().ok())
                {
                    Some(pid) => self.pid = Some(pid),
                    None => self.failed = Some("the shell did not say its pid".into()),
                }
            } else if self.line.len() > PID_MAX {
                self.failed = Some("the shell did not say its pid".into());
            }
        }
        if self.failed.is_none() && !b.is_empty() {
            match self.out.write_all(b) {
                Ok(()) => self.written += b.len() as u64,
                Err(e) => self.failed = Some(e.to_string()),
            }
        }
        self.failed.is_none()
    }
}

/// How `tar` ended, as the copy's result.
fn ended(code: i64, err: &[u8], container: &str, path: &str, base: &str) -> Result<()> {
    // GNU tar exits 1 when the directory it was asked for gained or lost
    // entries while it read it; what it archived is whole (a Maildir's
    // files appear by rename), so that is a success.
    let grew = format!("tar: {base}: file changed as we read it");
    let e = String::from_utf8_lossy(err);
    let only_grew = e.lines().count() > 0 && e.lines().all(|l| l.trim() == grew);
    match code {
        0 => Ok(()),
        1 if only_grew => Ok(()),
        n => {
            let why = e.trim();
            let exit = if why.contains("No such file") {
                Exit::NoInput
            } else {
                Exit::Unavailable
            };
            Err(Error::new(
                exit,
                format!(
                    "cannot copy '{path}' out of container '{container}': tar exited {n}: {why}"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_line_is_not_written_and_the_archive_is() {
        let mut out = Vec::new();
        let mut c = Copy::new(&mut out);
        assert!(c.take(OutStream::Stdout, b"12"));
        assert!(c.take(OutStream::Stdout, b"34\nab"));
        assert!(c.take(OutStream::Stderr, b"tar: x: warning\n"));
        assert!(c.take(OutStream::Stdout, b"cd"));
        assert_eq!((c.pid, c.written), (Some(1234), 4));
        drop(c);
        assert_eq!(out, b"abcd");
    }

    #[test]
    fn a_writer_that_fails_stops_the_copy() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut full = Full;
        let mut c = Copy::new(&mut full);
        assert!(c.take(OutStream::Stdout, b"7\n"));
        assert!(!c.take(OutStream::Stdout, b"archive"));
        assert!(!c.take(OutStream::Stdout, b"more"));
        assert_eq!(c.pid, Some(7));
        assert!(c.failed.is_some());
    }

    #[test]
    fn no_pid_line_or_endless_errors_stop_the_copy() {
        let mut out = Vec::new();
        let mut c = Copy::new(&mut out);
        assert!(!c.take(OutStream::Stdout, &[b'x'; PID_MAX + 1]));
        let mut c = Copy::new(&mut out);
        assert!(!c.take(OutStream::Stdout, b"tar\n"));
        let mut c = Copy::new(&mut out);
        assert!(!c.take(OutStream::Stderr, &vec![b'e'; ERR_MAX + 1]));
        assert!(out.is_empty());
    }

    #[test]
    fn a_directory_that_grew_is_a_success_and_a_missing_one_66() {
        let grew = b"tar: new: file changed as we read it\n";
        assert!(ended(1, grew, "c", "/o/new", "new").is_ok());
        let e = ended(
            2,
            b"tar: new: Cannot stat: No such file or directory\n",
            "c",
            "/o/new",
            "new",
        )
        .unwrap_err();
        assert_eq!(e.exit, Exit::NoInput);
        assert_eq!(
            ended(1, b"tar: other\n", "c", "/o/new", "new")
                .unwrap_err()
                .exit,
            Exit::Unavailable
        );
    }
}
