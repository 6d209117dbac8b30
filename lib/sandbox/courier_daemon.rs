//! The courier as the root's own daemon: a volume-mode `create` (and
//! `lw-sandbox courier --ensure`) makes sure one courier runs for the root,
//! so mail moves without anyone starting one by hand.
//!
//! * **One.**  `ROOT/state/courier.lock` (courier.rs) makes it one per
//!   root; the holder writes its pid to `ROOT/state/courier.pid`.  `ensure`
//!   starts one only when the lock is free; two racing `ensure`s start two,
//!   and the one that loses the lock exits at once saying who holds it.
//! * **Detached.**  `lw-sandbox courier --detached`, in a process group of
//!   its own, with no terminal and its output (timestamped pass lines and
//!   warnings, one of each repeat) appended to `ROOT/state/courier.log`
//!   (kept under [`LOG_MAX`]: the older half is `courier.log.1`).  It tells
//!   the `ensure` that started it its pid over a pipe once it holds the
//!   lock, or that another holds it, then closes that pipe.
//! * **Leaves by itself.**  When the root has no ready volume-mode sandbox
//!   (the last one removed, or the root itself removed) it removes its pid
//!   file, lets go of the lock and looks once more: a `create` that finished
//!   meanwhile saw the lock held and started nothing, so the courier takes
//!   the lock back and stays (or, when another took it, leaves it that one).
//! * **Restarted.**  A courier killed (even with SIGKILL) loses nothing
//!   (mailbox-spec.md, REMOTE ENGINES); the next volume-mode `create` or
//!   `courier --ensure` starts another.  `courier --stop` ends it (SIGTERM)
//!   and returns once its lock is free.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Sandboxes;
use crate::error::{Error, Exit, Result};
use crate::layout::Root;

/// The log is cut when it grows past this many bytes.
pub const LOG_MAX: u64 = 1 << 20;

/// `ROOT/state/courier.log`.
pub fn log_path(root: &Root) -> PathBuf {
    root.state_dir().join("courier.log")
}

/// `ROOT/state/courier.pid`.
pub fn pid_path(root: &Root) -> PathBuf {
    root.state_dir().join("courier.pid")
}

/// The pid file of the courier holding the lock; removed before the lock
/// is let go, so it never names a courier that no longer holds it.
pub struct PidFile(PathBuf);

impl PidFile {
    pub fn write(root: &Root) -> Result<PidFile> {
        let p = pid_path(root);
        let pid = format!("{}\n", std::process::id());
        crate::fs::write_replace(&p, pid.as_bytes(), 0o600, crate::fs::Durability::Unsynced)
            .map_err(|e| Error::io("cannot write", &p, e))?;
        Ok(PidFile(p))
    }
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.0);
    }
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

/// The pid of the courier holding the root's lock, if one does.
pub fn running(root: &Root) -> Result<Option<u32>> {
    if super::courier::take_lock(root)?.is_some() {
        return Ok(None);
    }
    Ok(std::fs::read_to_string(pid_path(root))
        .ok()
        .and_then(|s| s.trim().parse().ok()))
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
        return Ok(match self::stop(root)? {
            Some(pid) => format!("stopped {pid}"),
            None => "none".to_string(),
        });
    }
    Ok(match ensure_from(root, project, interval_ms)? {
        Ensured::Started(pid) => format!("started {pid}"),
        Ensured::Running(pid) => format!("running {pid}"),
    })
}

/// `lw-sandbox courier` in the foreground: a line `out N in N read N junk
/// N` for each pass that moved something (every pass with `once`).
pub fn foreground(
    sb: &Sandboxes,
    once: bool,
    interval_ms: u64,
    out: &mut dyn std::io::Write,
    warn: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut report = |c: &super::courier::Carried| {
        if once || *c != super::courier::Carried::default() {
            let (o, i, r, j) = (c.out, c.into, c.read, c.junk);
            let _ = writeln!(out, "out {o} in {i} read {r} junk {j}").and_then(|()| out.flush());
        }
    };
    let interval = std::time::Duration::from_millis(interval_ms.max(1));
    super::courier::run(sb, interval, once, &mut report, warn)
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
    let stamp = || crate::time::rfc3339(crate::time::now());
    let Some(lock) = super::courier::take_lock(&sb.root)? else {
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
    let mut report = |c: &super::courier::Carried| {
        if !warned.replace(false) {
            seen.borrow_mut().clear();
        }
        if *c != super::courier::Carried::default() {
            let (o, i, r, j) = (c.out, c.into, c.read, c.junk);
            let _ = writeln!(log, "{} out {o} in {i} read {r} junk {j}", stamp());
        }
    };
    let mut warn = |m: &str| {
        warned.set(true);
        if seen.borrow_mut().insert(m.to_string()) {
            let _ = writeln!(log2, "{} warning: {m}", stamp());
        }
    };
    let mut idle = |n: usize| n == 0 && may_leave(sb, &mut held);
    super::courier::serve(sb, interval, false, &mut report, &mut warn, &mut idle)?;
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
    let any = super::courier::Courier::new(sb)
        .sandboxes()
        .is_ok_and(|r| !r.is_empty());
    if !any {
        return true;
    }
    match super::courier::take_lock(&sb.root) {
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

/// `courier --stop`: ends the root's courier (SIGTERM; its state is safe
/// at any instant) and waits until its lock is free and its children (an
/// ssh tunnel) have ended.  The pid it stopped,
/// or None when none ran.
pub fn stop(root: &Root) -> Result<Option<u32>> {
    let Some(pid) = running(root)? else {
        return Ok(None);
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if !String::from_utf8_lossy(&cmdline).contains("courier") {
        return Err(Error::new(
            Exit::Software,
            format!(
                "'{}' names pid {pid}, which is not a courier; the courier lock '{}' is held by another process (fuser -v it)",
                pid_path(root).display(),
                super::courier::lock_path(root).display()
            ),
        ));
    }
    // Its children (an ssh tunnel to a remote engine) end when it does, as
    // their standard input closes, but after its lock is free: wait for
    // them too, so nothing of the courier outlives `--stop`.
    let children = children_of(pid);
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    let path = super::courier::lock_path(root);
    let waited = crate::fs::lock(&path).map_err(|e| Error::lock(&path, e))?;
    drop(waited);
    for fd in children {
        let mut polled = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let bound = rustix::event::Timespec {
            tv_sec: CHILD_WAIT_SECS,
            tv_nsec: 0,
        };
        let _ = rustix::event::poll(&mut polled, Some(&bound));
    }
    Ok(Some(pid))
}

/// How long `--stop` waits for each of the courier's children to end.
const CHILD_WAIT_SECS: i64 = 5;

/// Process descriptors (pidfds: readable once the process ends) of the
/// children of `pid`, found by their parent in /proc.
fn children_of(pid: u32) -> Vec<rustix::fd::OwnedFd> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|st| {
                st.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .is_some_and(|ppid| ppid == pid.to_string())
            })
        })
        .filter_map(|child| {
            let p = rustix::process::Pid::from_raw(child)?;
            rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
        })
        .collect()
}
