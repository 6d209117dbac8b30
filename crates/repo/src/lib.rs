//! The crate `repo`: the repositories loopwright keeps and reads.
//!
//! - [`git`]: the git CLI run safely (no shell, a scrubbed environment,
//!   credentials out of argv and config), and the one hardened fetch from a
//!   repository a sandbox wrote;
//! - [`mirror`]: the bare mirror every sandbox clones from, which never
//!   prunes (lw-mirror(1));
//! - [`radar`]: conflicts between live task branches, seen before anyone
//!   merges (lw-radar(1)).
//!
//! It names no engine: fetching from a sandbox goes through a transport its
//! caller hands in, so a change to the sandboxes or the images does not
//! rebuild it.

pub mod git;
pub mod mirror;
pub mod radar;
