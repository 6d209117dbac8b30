//! One courier per root: the lock its holder keeps, the pid file that
//! names it, and stopping it (the module documentation, "One").

use std::path::PathBuf;

use base::error::{Error, Exit, Result};
use mailbox::layout::Root;

/// `ROOT/state/courier.lock`: held by the root's one courier.
pub fn lock_path(root: &Root) -> PathBuf {
    root.state_dir().join("courier.lock")
}

/// The courier lock of the root, or None when another courier holds it.
pub fn take_lock(root: &Root) -> Result<Option<std::fs::File>> {
    let state = root.state_dir();
    root.make_dir(&state)
        .map_err(|e| Error::io("cannot create", &state, e))?;
    let path = lock_path(root);
    base::fs::try_lock(&path).map_err(|e| Error::lock(&path, e))
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
        base::fs::write_replace(&p, pid.as_bytes(), 0o600, base::fs::Durability::Unsynced)
            .map_err(|e| Error::io("cannot write", &p, e))?;
        Ok(PidFile(p))
    }
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The pid of the courier holding the root's lock, if one does.
pub fn running(root: &Root) -> Result<Option<u32>> {
    if take_lock(root)?.is_some() {
        return Ok(None);
    }
    Ok(std::fs::read_to_string(pid_path(root))
        .ok()
        .and_then(|s| s.trim().parse().ok()))
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
                lock_path(root).display()
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
    let path = lock_path(root);
    let waited = base::fs::lock(&path).map_err(|e| Error::lock(&path, e))?;
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
