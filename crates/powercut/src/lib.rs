//! A power-cut file system for the door's tests (tracker issue #41).
//!
//! SIGKILL storms prove little about durability: the process dies but the
//! kernel's page cache survives, so un-fsynced writes and renames still reach
//! the disk.  This FUSE file system keeps every write, create, rename, link
//! and unlink in memory, makes them durable only as an fsync of the file (its
//! data) or of its directory (its names) would on ext4, and on a cut drops
//! everything else and serves what survived (see [`model`]).  A cut happens
//! on demand ([`PowerCut::cut`]) or right after the Nth durability point
//! ([`PowerCut::arm`]), so a test can cut at every fsync of a story in turn.
//!
//! It lives in memory only: no host directory backs it, and an unmount
//! forgets everything.

pub mod fuse;
pub mod model;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use model::Model;

/// A mounted power-cut file system; unmounted when dropped.
pub struct PowerCut {
    model: Arc<Mutex<Model>>,
    session: Option<fuser::BackgroundSession>,
    pub mountpoint: PathBuf,
}

impl PowerCut {
    /// Mounts an empty file system on `mountpoint` (an existing directory).
    /// Needs /dev/fuse and root (or fusermount3).
    pub fn mount(mountpoint: &Path) -> io::Result<PowerCut> {
        let model = Arc::new(Mutex::new(Model::default()));
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            fuser::MountOption::FSName("lw-powercut".into()),
            fuser::MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount(fuse::Fs(model.clone()), mountpoint, &cfg)?;
        Ok(PowerCut {
            model,
            session: Some(session),
            mountpoint: mountpoint.to_path_buf(),
        })
    }

    fn m(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Durability points (fsyncs of files and directories) since the last
    /// [`PowerCut::restore`] or [`PowerCut::reset_count`].
    pub fn syncs(&self) -> u64 {
        self.m().syncs
    }

    pub fn reset_count(&self) {
        self.m().syncs = 0;
    }

    /// Cut right after durability point `n` (1-based) takes effect.
    pub fn arm(&self, n: u64) {
        self.m().armed = Some(n);
    }

    /// Cut now.
    pub fn cut(&self) {
        self.m().cut();
    }

    /// The durability point the last cut happened after, if one happened.
    pub fn cut_at(&self) -> Option<u64> {
        self.m().cut_at
    }

    /// Whether the power is off (every operation fails with EIO).
    pub fn is_cut(&self) -> bool {
        self.m().dead
    }

    /// Power back on: serve what survived.
    pub fn restore(&self) {
        let mut m = self.m();
        m.restore();
        m.cut_at = None;
    }

    /// Everything durable now (`sync`), without counting a durability point.
    pub fn sync_all(&self) {
        self.m().sync_all();
    }

    /// Answer RENAME_NOREPLACE with EINVAL (gVisor does), so writers take
    /// their link+unlink path.
    pub fn refuse_noreplace(&self, on: bool) {
        self.m().refuse_noreplace = on;
    }

    /// link(2) calls served so far.
    pub fn links(&self) -> u64 {
        self.m().links
    }
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        if let Some(s) = self.session.take()
            && s.umount_and_join().is_err()
        {
            // Busy (a process still inside): detach it, so no dead mount
            // outlives the test.
            if let Ok(p) = std::ffi::CString::new(self.mountpoint.as_os_str().as_encoded_bytes()) {
                // SAFETY: a valid NUL-terminated path; umount2 reads it only.
                #[allow(unsafe_code)]
                unsafe {
                    libc::umount2(p.as_ptr(), libc::MNT_DETACH)
                };
            }
        }
    }
}
