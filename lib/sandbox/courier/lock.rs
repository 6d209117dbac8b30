//! One courier per root: the lock its holder keeps, the pid file that
//! names it, and stopping it (the module documentation, "One").

use std::path::PathBuf;

use crate::error::{Error, Exit, Result};
use crate::layout::Root;

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
    crate::fs::try_lock(&path).map_err(|e| Error::lock(&path, e))
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
/// at any instant) and waits until its lock is free.  The pid it stopped,
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
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    }
    let path = lock_path(root);
    let waited = crate::fs::lock(&path).map_err(|e| Error::lock(&path, e))?;
    drop(waited);
    Ok(Some(pid))
}
