//! What loopwright's integration tests share, compiled once for every test
//! binary: [`bin`], [`nonce`] and [`tempdir`], and the helpers of each area
//! (sandboxes, the GitHub peer, images, registries, the test cluster, MCP
//! clients); those that reach into the product's library are behind the
//! `product` feature (docs/architecture.md).
//!
//! [`bin`] finds a command of the workspace in the target directory the
//! test runs from.  Cargo hands a test only its own package's commands
//! (`CARGO_BIN_EXE_*`), but the stories run lw-post and lw-mediate (the
//! `mailbox` crate's) beside lw-sandbox (the product's), and the sync tests
//! lw-github-sink (its own package).  Cargo builds a package's commands
//! for its integration tests, and every package with commands has some, so
//! `cargo test` at the top builds them all; a command that is missing fails the
//! test with the command that builds it.  `cargo test --test X` builds only
//! the product's commands: after changing crates/mailbox or
//! bins/lw-github-sink, run `cargo build --workspace` first (cargo may
//! leave a binary older than its sources when nothing it links changed, so
//! an mtime check here would cry wolf).

use std::path::{Path, PathBuf};

pub mod build;
#[cfg(feature = "product")]
pub mod cluster;
pub mod common;
pub mod courier;
pub mod egress;
#[cfg(feature = "product")]
pub mod federation;
pub mod mcp;
pub mod mediate_util;
#[cfg(feature = "product")]
pub mod registry;
#[cfg(feature = "product")]
pub mod sandbox;
pub mod seeded;
#[cfg(feature = "sync")]
pub mod sync;

/// The workspace's top directory (this crate is crates/test-support).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/test-support sits two levels below the workspace")
        .to_path_buf()
}

/// The path of command `name` in the target directory this test runs from
/// (target/<profile>/deps/TEST → target/<profile>/NAME).  Panics, naming
/// the fix, when it is missing.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("tests live in target/<profile>/deps")
        .join(name);
    assert!(
        path.is_file(),
        "{name} is not built at {}: run `cargo test` at the workspace's top \
         (or `cargo build --workspace` before `cargo test --test ...`)",
        path.display()
    );
    path
}

/// A short random tag for names that must not meet another test's or run's
/// (containers, networks, sandboxes, branches): the process id and 32 random
/// bits, in hex, at most 16 characters.
pub fn nonce() -> String {
    let mut b = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .expect("/dev/urandom is readable");
    format!("{:x}{:08x}", std::process::id(), u32::from_ne_bytes(b))
}

/// A new empty directory under the system's temporary directory, named
/// `lw-TAG-…`; left for the test (or the machine) to remove (made as
/// [`common::TempDir`] is, then kept).
pub fn tempdir(tag: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("lw-{tag}-"))
        .tempdir()
        .expect("the temporary directory is writable")
        .keep()
}

/// The target directory's `tmp/` (what cargo names CARGO_TARGET_TMPDIR for
/// integration tests): target/<triple>/tmp beside target/<triple>/debug.
pub fn target_tmp() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its path");
    let d = exe
        .ancestors()
        .nth(3)
        .expect("tests live in target/<triple>/<profile>/deps")
        .join("tmp");
    std::fs::create_dir_all(&d).expect("the target directory is writable");
    d
}
