//! The filesystem toolkit: the one home of the mechanisms every command
//! shares, so each rule is written once.
//!
//! * [`rename_noreplace_at`]: move a file without ever replacing one, with a
//!   `link`+`unlink` fallback where the filesystem refuses
//!   `RENAME_NOREPLACE` (gVisor's gofer and some network filesystems answer
//!   `EINVAL`).  Every delivery and claim in the mailbox goes through it.
//! * [`write_replace`]: replace a whole small file atomically (state,
//!   records, leases): a fresh temporary file beside it (`O_EXCL`, no
//!   symlink followed), written, fsync'd, renamed over the old one, then the
//!   directory fsync'd so the rename itself survives a crash.
//! * [`lock`]: an advisory `flock(2)` on a lock file, released by the kernel
//!   when its holder dies; callers choose to wait or to be told it is busy
//!   (and then exit 75, try again later).
//! * [`open_beneath`]: resolve a path a sandbox can write beneath a
//!   directory descriptor, refusing a symbolic link at every component
//!   (openat2, or a component walk where it is missing); with
//!   [`remove_tree_at`], the only way host-side code opens or removes
//!   anything in a sandbox's tree.
//! * [`Watcher`]: a directory watch on inotify, woken by arrivals, with a
//!   queue overflow reported as "rescan" rather than lost.
//!
//! * [`private_dir`]: make a directory, and any missing parent, mode 0700
//!   whatever the umask (a mailbox root and its state).
//!
//! These functions return `std::io::Error`; the caller names the path and
//! the step in its own typed error, as it always did.

mod atomic;
mod beneath;
mod lock;
mod watch;

pub use atomic::{Durability, rename_noreplace_at, sync_dir, write_replace, write_replace_with};
pub use beneath::{open_beneath, open_dir_beneath, open_dir_no_links, remove_tree, remove_tree_at};
pub use lock::{lock, try_lock};

/// Makes `dir` and its missing parents, each mode 0700 whatever the umask;
/// an existing one is left as it is.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}
pub use watch::{Watcher, Woke};

/// Bytes of the regular files under `dir`, not following links (a host
/// directory git filled: push's and the radar's quarantine repositories).
pub fn tree_size(dir: &std::path::Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}
