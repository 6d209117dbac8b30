//! A claim a power cut half-kept.
//!
//! A claim renames `new/NAME` to `cur/NAME` and fsyncs `cur/` (mailbox-spec.md,
//! CLAIM).  The rename touches two directories, and POSIX makes each
//! directory's names durable only by its own fsync: a power cut after the
//! fsync of `cur/` and before anything fsyncs `new/` can bring both names
//! back, one file with two links.  No order of the two fsyncs closes that
//! window (`new/` first could lose the file altogether), so readers settle
//! it instead: a name in `new/` that is the same file as `cur/NAME` was
//! claimed, and its `new/` name is removed.  ext4 journals a rename as one
//! transaction and never shows this; the power-cut file system of the tests
//! (crates/powercut) does, as a file system keeping only the POSIX promise may.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;

use rustix::fs::{self as rfs, AtFlags, FileType};
use rustix::io::Errno;

/// True when `NAME` in `new` is the same regular file as `NAME` in `cur`:
/// a claim whose `new/` side a power cut undid.  Then the `new/` name has
/// been removed (beneath the directory's descriptor) and the caller skips it.
pub fn settle_claimed(new: &OwnedFd, cur: &OwnedFd, name: &OsStr) -> bool {
    let Ok(st) = rfs::statat(new, name, AtFlags::SYMLINK_NOFOLLOW) else {
        return false;
    };
    if st.st_nlink < 2 || FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return false;
    }
    match rfs::statat(cur, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(c) if (c.st_dev, c.st_ino) == (st.st_dev, st.st_ino) => {
            matches!(
                rfs::unlinkat(new, name, AtFlags::empty()),
                Ok(()) | Err(Errno::NOENT)
            )
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use crate::maildir::{Maildir, Sub};

    #[test]
    fn a_half_kept_claim_is_finished_and_a_planted_link_elsewhere_is_not() {
        let d = std::env::temp_dir().join(format!("lw-twin-{}", base::id::new_id()));
        let md = Maildir::new(&d);
        md.create().unwrap();
        let (new, cur) = (md.sub(Sub::New), md.sub(Sub::Cur));
        std::fs::write(new.join("a"), "x").unwrap();
        std::fs::hard_link(new.join("a"), cur.join("a")).unwrap();
        std::fs::write(new.join("b"), "y").unwrap();
        std::fs::hard_link(new.join("b"), d.join("tmp/b")).unwrap();
        assert_eq!(md.names(Sub::New).unwrap(), ["b"], "a was claimed");
        assert!(!new.join("a").exists() && cur.join("a").exists());
        assert!(new.join("b").exists(), "a link in tmp/ is not a claim");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
