//! The detached courier: started unless one runs (`ensure`), its log
//! (`ROOT/state/courier.log`), and leaving by itself when the root has no
//! volume-mode sandbox left (the module documentation, "Detached" and
//! "Leaves by itself").

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::carry::{Carried, Courier};
use super::lock::{self, PidFile, running, take_lock};
use super::serve::{Told, serve};
use crate::sandbox::Sandboxes;
use base::error::{Error, Exit, Result};
use mailbox::layout::Root;

/// The log is cut when it grows past this many bytes.
pub const LOG_MAX: u64 = 1 << 20;

/// `ROOT/state/courier.log`.
pub fn log_path(root: &Root) -> PathBuf {
    root.state_dir().join("courier.log")
}

/// What `ensure` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// A courier held the lock already: its pid.
    Running(u32),
    /// This call started one: its pid.
    Started(u32),
}

impl Ensured {
    pub fn pid(self) -> u32 {
        match self {
            Ensured::Running(p) | Ensured::Started(p) => p,
        }
    }
}

/// Makes sure a courier runs for the root: starts `me courier --detached`
/// (`me` being lw-sandbox, `args` the global flags it needs before the
/// subcommand) unless one holds the lock.
pub fn ensure(root: &Root, me: &Path, args: &[OsString], interval_ms: u64) -> Result<Ensured> {
    if let Some(pid) = running(root)? {
        return Ok(Ensured::Running(pid));
    }
    let log = open_log(root)?;
    let mut child = Command::new(me)
        .args(args)
        .arg("--root")
        .arg(&root.dir)
        .args([
            "courier",
            "--detached",
            "--interval",
            &interval_ms.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| {
            Error::new(
                Exit::Software,
                format!("cannot start the courier ({}): {e}", me.display()),
            )
        })?;
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    let word: Vec<&str> = line.split_whitespace().collect();
    match (read, word.as_slice()) {
        (Ok(_), ["started", pid]) => Ok(Ensured::Started(pid.parse().unwrap_or(child.id()))),
        (Ok(_), ["running", pid]) => Ok(Ensured::Running(pid.parse().unwrap_or(0))),
        _ => {
            // It died before holding the lock: its reason is in the log.
            let _ = child.wait();
            Err(Error::new(
                Exit::Unavailable,
                format!(
                    "the courier of '{}' did not start: {}",
                    root.dir.display(),
                    last_line(&log_path(root))
                ),
            ))
        }
    }
}

/// [`ensure`] from lw-sandbox itself: this program, with `--project`
/// (made absolute) when the caller was given one.
pub fn ensure_from(root: &Root, project: Option<&Path>, interval_ms: u64) -> Result<Ensured> {
    let me = std::env::current_exe()
        .map_err(|e| Error::new(Exit::Software, "cannot find lw-sandbox itself").with_source(e))?;
    let mut args: Vec<OsString> = Vec::new();
    if let Some(p) = project {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        args.extend(["--project".into(), p.into_os_string()]);
    }
    ensure(root, &me, &args, interval_ms)
}

/// `courier --ensure` (`started PID`, `running PID`) or `--stop`
/// (`stopped PID`, `none`): the line to print.
pub fn control(
    root: &Root,
    project: Option<&Path>,
    interval_ms: u64,
    stop: bool,
) -> Result<String> {
    if stop {
        return Ok(match lock::stop(root)? {
            Some(pid) => format!("stopped {pid}"),
            None => "none".to_string(),
        });
    }
    Ok(match ensure_from(root, project, interval_ms)? {
        Ensured::Started(pid) => format!("started {pid}"),
        Ensured::Running(pid) => format!("running {pid}"),
    })
}

/// The log, opened for appending; the older half moved to `.1` past [`LOG_MAX`].
fn open_log(root: &Root) -> Result<File> {
    let p = log_path(root);
    if std::fs::metadata(&p).is_ok_and(|m| m.len() > LOG_MAX) {
        let mut old = p.clone().into_os_string();
        old.push(".1");
        // The previous `.1` goes: two halves are kept, never more.
        let _ = std::fs::rename(&p, &old);
    }
    root.make_dir(&root.state_dir())
        .map_err(|e| Error::io("cannot create", &root.state_dir(), e))?;
    File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| Error::io("cannot open", &p, e))
}

fn last_line(p: &Path) -> String {
    std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.lines().last().map(str::to_string))
        .unwrap_or_else(|| format!("see {}", p.display()))
}

/// `courier --detached`: holds the lock (or says who does and leaves),
/// tells the starter its pid, and carries until the root has no
/// volume-mode sandbox left.
pub fn detached(sb: &Sandboxes, interval: std::time::Duration) -> Result<()> {
    let mut log = open_log(&sb.root)?;
    let mut log2 = log
        .try_clone()
        .map_err(|e| Error::io("cannot open", &log_path(&sb.root), e))?;
    let stamp = || base::time::rfc3339(base::time::now());
    let Some(lock) = take_lock(&sb.root)? else {
        let pid = running(&sb.root)?.unwrap_or(0);
        handshake(&format!("running {pid}"));
        let _ = writeln!(log, "{} courier {pid} runs already", stamp());
        return Ok(());
    };
    let mut held = Some((lock, PidFile::write(&sb.root)?));
    handshake(&format!("started {}", std::process::id()));
    let _ = writeln!(log, "{} courier {} started", stamp(), std::process::id());
    // An engine that is down says so for every sandbox every pass: each
    // warning is logged once while passes keep warning, again after a
    // pass without any.
    let seen = std::cell::RefCell::new(std::collections::HashSet::<String>::new());
    let warned = std::cell::Cell::new(false);
    let mut report = |t: Told| match t {
        Told::Pass(c) => {
            if !warned.replace(false) {
                seen.borrow_mut().clear();
            }
            if *c != Carried::default() {
                let (o, i, r, j) = (c.out, c.into, c.read, c.junk);
                let _ = writeln!(log, "{} out {o} in {i} read {r} junk {j}", stamp());
            }
        }
        Told::Rings { live, of } => {
            let _ = writeln!(log, "{} rings {live} of {of} live", stamp());
        }
        Told::Pool { key, made, drained } => {
            let _ = writeln!(log, "{} pool {key} made {made} drained {drained}", stamp());
        }
    };
    let mut warn = |m: &str| {
        warned.set(true);
        if seen.borrow_mut().insert(m.to_string()) {
            let _ = writeln!(log2, "{} warning: {m}", stamp());
        }
    };
    let mut idle = |n: usize| n == 0 && may_leave(sb, &mut held);
    serve(sb, interval, false, true, &mut report, &mut warn, &mut idle)?;
    if let Some((_, pid)) = held {
        pid.remove();
    }
    let me = std::process::id();
    let _ = writeln!(
        log2,
        "{} courier {me} leaves: no volume-mode sandbox is left",
        stamp()
    );
    Ok(())
}

/// One line to whoever started us, then standard output is /dev/null: the
/// starter has gone on.
fn handshake(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    if let Ok(null) = File::options().write(true).open("/dev/null") {
        let _ = rustix::stdio::dup2_stdout(&null);
    }
}

/// No volume-mode sandbox is left: lets go of the lock, then looks again
/// (see the module documentation).  True when the courier should leave.
fn may_leave(sb: &Sandboxes, held: &mut Option<(File, PidFile)>) -> bool {
    if let Some((lock, pid)) = held.take() {
        pid.remove();
        drop(lock);
    }
    if !sb.root.dir.exists() {
        return true;
    }
    let any = Courier::new(sb).sandboxes().is_ok_and(|r| !r.is_empty());
    if !any {
        return true;
    }
    match take_lock(&sb.root) {
        Ok(Some(lock)) => match PidFile::write(&sb.root) {
            Ok(pid) => {
                *held = Some((lock, pid));
                false
            }
            Err(_) => true,
        },
        _ => true,
    }
}
