//! One lock helper: `flock(2)` on a lock file that is never removed.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// Takes an exclusive lock on `path` (created if missing, never truncated),
/// waiting for it.  The lock lives as long as the returned file is open, and
/// the kernel releases it when the holder dies, so a crash never leaves it
/// stuck.
pub fn lock(path: &Path) -> io::Result<File> {
    let f = open(path)?;
    f.lock()?;
    Ok(f)
}

/// Like [`lock`], but `Ok(None)` at once when another process holds it; the
/// caller says who holds it and exits 75 (try again later).
pub fn try_lock(path: &Path) -> io::Result<Option<File>> {
    let f = open(path)?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_busy_and_free_again_when_dropped() {
        let p = std::env::temp_dir().join(format!("lw-lock-{}", crate::id::new_id()));
        let held = try_lock(&p).expect("lock").expect("free at first");
        assert!(try_lock(&p).expect("try").is_none(), "second holder got it");
        drop(held);
        assert!(try_lock(&p).expect("try").is_some());
        std::fs::remove_file(p).ok();
    }
}
